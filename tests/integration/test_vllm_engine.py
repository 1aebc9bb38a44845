"""VllmEngine against real vLLM (CPU build) and the converted SmolLM2-135M-Instruct.

Skipped when vLLM or the converted model is missing, unless AGENTD_REQUIRE_VLLM=1
(then missing pieces fail the run). The model directory is AGENTD_TEST_MODEL_DIR
or the default one `agentd model fetch-smollm2` writes.

The shared engine runs float32: on this CPU vLLM's bf16 kernels flip SmolLM2's
greedy answer to the France question (bf16 answers other questions correctly),
so the bf16 default is exercised by the preemption test instead.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from daemon.models.smollm2 import kv_bytes_per_token
from daemon.workers.protocol import ChatMessage, Finish, SamplingParams, Submit, TokenDelta
from tests.vllm_support import MODEL_DIR, _require_vllm
from tests.waiting import wait_for_async

if TYPE_CHECKING:
    from daemon.engines.base import Engine
    from daemon.engines.vllm.engine import VllmEngine

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

BLOCK = 128
KV_BYTES_PER_TOKEN_FP32 = kv_bytes_per_token("float32")
KV_BYTES_PER_TOKEN_BF16 = kv_bytes_per_token("bfloat16")
SHARED_KV_BYTES = 64 << 20


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[VllmEngine]:
    _require_vllm()
    from daemon.engines.vllm.engine import VllmEngine

    eng = VllmEngine(
        str(MODEL_DIR), kv_cache_bytes=SHARED_KV_BYTES, block_size=BLOCK,
        max_model_len=1024, dtype="float32",
    )
    await eng.start()
    yield eng
    await eng.shutdown()


def _chat(rid: str, text: str, **sampling: object) -> Submit:
    return Submit(
        request_id=rid, program_id="p-test", messages=[ChatMessage("user", text)],
        sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
    )


async def _collect(eng: VllmEngine, submit: Submit) -> tuple[list[TokenDelta], Finish]:
    deltas: list[TokenDelta] = []
    finish: Finish | None = None
    async for out in eng.generate(submit):
        assert finish is None, "nothing may follow the Finish"
        if isinstance(out, Finish):
            finish = out
        else:
            deltas.append(out)
    assert finish is not None, "the stream must end with a Finish"
    return deltas, finish


async def test_answers_capital_of_france(engine: VllmEngine) -> None:
    submit = _chat("france", "What is the capital of France?", temperature=0.0, max_tokens=24)
    deltas, finish = await _collect(engine, submit)
    text = "".join(d.text for d in deltas)
    assert "Paris" in text
    assert finish.reason == "stop"
    assert finish.output_tokens == sum(d.num_tokens for d in deltas)
    assert finish.prompt_tokens == len(engine.prompt_token_ids(submit))
    assert finish.ttft_s is not None and finish.ttft_s > 0


async def test_streams_several_deltas_with_prompt_info_first(engine: VllmEngine) -> None:
    submit = _chat("stream", "Count from one to twenty.", temperature=0.0, max_tokens=16)
    deltas, finish = await _collect(engine, submit)
    assert len(deltas) >= 5
    assert deltas[0].prompt_tokens == finish.prompt_tokens > 0
    assert deltas[0].cached_tokens is not None
    assert all(d.prompt_tokens is None for d in deltas[1:])
    assert finish.reason == "length" and finish.output_tokens == 16


async def test_continuation_is_appended_after_the_rendered_prompt(engine: VllmEngine) -> None:
    base = _chat("cont-base", "What is the capital of France?", temperature=0.0, max_tokens=8)
    cont = Submit(
        request_id="cont", program_id="p-test", messages=base.messages,
        continuation="The capital of France is", sampling=base.sampling,
    )
    base_ids = engine.prompt_token_ids(base)
    cont_ids = engine.prompt_token_ids(cont)
    assert cont_ids[: len(base_ids)] == base_ids and len(cont_ids) > len(base_ids)
    deltas, _ = await _collect(engine, cont)
    assert "".join(d.text for d in deltas).lstrip().startswith("Paris")


async def test_abort_mid_stream_ends_with_abort_and_frees_the_slot(engine: VllmEngine) -> None:
    essay = "Write a very long, detailed essay about the history of the Roman Empire."
    keep = _chat("keep", essay, temperature=0.0, max_tokens=400)
    victim = _chat("victim", essay + " Start with Augustus.", temperature=0.0, max_tokens=400)
    keep_task = asyncio.create_task(_collect(engine, keep))
    seen: list[TokenDelta] = []
    finish: Finish | None = None
    async for out in engine.generate(victim):
        if isinstance(out, Finish):
            finish = out
            break
        seen.append(out)
        if len(seen) == 3:
            await wait_for_async(lambda: engine.stats().running == 2, 10, "two running")
            await engine.abort("victim")
    assert finish is not None and finish.reason == "abort"
    assert finish.output_tokens < 400
    await wait_for_async(lambda: engine.stats().running == 1, 10, "one running")
    await engine.abort("keep")
    _, keep_finish = await keep_task
    assert keep_finish.reason == "abort"
    await wait_for_async(lambda: engine.stats().running == 0, 10, "none running")


async def test_extending_a_prompt_reuses_its_cached_prefix(engine: VllmEngine) -> None:
    # Prefix caching works on whole blocks, so the shared part spans several.
    story = " ".join(f"Step {i}: the agent opened file number {i} and read it." for i in range(40))
    first = Submit(
        request_id="prefix-1", program_id="p-test", prompt=story,
        sampling=SamplingParams(temperature=0.0, max_tokens=2),
    )
    second = Submit(
        request_id="prefix-2", program_id="p-test", prompt=story + " Then it ran the tests.",
        sampling=SamplingParams(temperature=0.0, max_tokens=2),
    )
    hits_before = engine.stats().prefix_cache_hits
    _, f1 = await _collect(engine, first)
    deltas, f2 = await _collect(engine, second)
    assert f1.prompt_tokens >= 3 * BLOCK
    assert f2.cached_tokens >= (f1.prompt_tokens // BLOCK) * BLOCK - BLOCK > 0
    assert deltas[0].cached_tokens == f2.cached_tokens
    await wait_for_async(
        lambda: engine.stats().prefix_cache_hits - hits_before >= f2.cached_tokens, 10,
        "the cached tokens in the prefix-cache hits")


async def test_kv_capacity_is_blocks_times_block_size(engine: VllmEngine) -> None:
    cache = engine._llm.vllm_config.cache_config
    assert cache.block_size == BLOCK
    assert engine.kv_capacity_tokens == cache.num_gpu_blocks * BLOCK
    # Independently: the configured bytes hold this many whole fp32 blocks of this model.
    expected_blocks = SHARED_KV_BYTES // (BLOCK * KV_BYTES_PER_TOKEN_FP32)
    assert engine.kv_capacity_tokens == expected_blocks * BLOCK
    # Typed as the worker sees it: mypy checks VllmEngine satisfies the Engine protocol.
    as_worker_sees_it: Engine = engine
    assert as_worker_sees_it.stats().kv_capacity_tokens == engine.kv_capacity_tokens


async def test_json_schema_constrains_the_output(engine: VllmEngine) -> None:
    schema = {
        "type": "object",
        # A boolean rather than a number: greedy SmolLM2 repeats digits until max_tokens.
        "properties": {"city": {"type": "string"}, "is_capital": {"type": "boolean"}},
        "required": ["city", "is_capital"],
        "additionalProperties": False,
    }
    submit = _chat(
        "json", "Describe Paris as JSON.", temperature=0.0, max_tokens=60,
        json_schema=json.dumps(schema),
    )
    deltas, finish = await _collect(engine, submit)
    text = "".join(d.text for d in deltas)
    assert finish.reason == "stop", text
    value = json.loads(text)
    assert set(value) == {"city", "is_capital"} and isinstance(value["is_capital"], bool)


async def test_prompt_longer_than_the_model_ends_with_an_error_finish(engine: VllmEngine) -> None:
    submit = Submit(
        request_id="too-long", program_id="p-test", prompt_token_ids=[42] * 2000,
        sampling=SamplingParams(max_tokens=4),
    )
    deltas, finish = await _collect(engine, submit)
    assert deltas == [] and finish.reason == "error" and finish.error


async def test_tiny_kv_cache_preempts_and_counts_it() -> None:
    _require_vllm()
    from daemon.engines.vllm.engine import VllmEngine

    # Eight 32-token bf16 blocks: every ~28-token prompt fits in one, so all eight
    # are admitted, and each needs a second block within a few decode steps.
    small_block = 32
    tiny = VllmEngine(
        str(MODEL_DIR), kv_cache_bytes=8 * small_block * KV_BYTES_PER_TOKEN_BF16,
        block_size=small_block, max_model_len=128, max_num_seqs=16,
    )
    await tiny.start()
    try:
        assert tiny.kv_capacity_tokens == 8 * small_block
        submits = [
            Submit(
                request_id=f"crowd-{i}", program_id=f"p{i}",
                prompt=f"Ship log {i}. The harbour was calm and the crew was ready."
                " Write the next entry of the ship log:",
                sampling=SamplingParams(temperature=0.8, seed=i, max_tokens=24),
            )
            for i in range(8)
        ]
        assert all(
            len(tiny.prompt_token_ids(s)) < small_block for s in submits
        )
        peak_used = 0

        async def watch() -> None:
            nonlocal peak_used
            while True:
                peak_used = max(peak_used, tiny.stats().kv_used_tokens)
                await asyncio.sleep(0.05)  # the sampling period of a peak, not a wait

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(_collect(tiny, s) for s in submits))
        watcher.cancel()
        assert all(f.reason in ("stop", "length") for _, f in results)
        assert tiny.stats().preemptions > 0, tiny.stats()
        assert 0 < peak_used <= tiny.kv_capacity_tokens
    finally:
        await tiny.shutdown()


async def test_dummy_weights_run_a_model_directory_without_weights(tmp_path: Path) -> None:
    """`agentd calibrate --load-format dummy` times a model's shape from config.json alone."""
    _require_vllm()
    import shutil

    from daemon.engines.vllm.engine import VllmEngine

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODEL_DIR / name, tmp_path / name)
    shaped = VllmEngine(str(tmp_path), kv_cache_bytes=4 * BLOCK * KV_BYTES_PER_TOKEN_FP32,
                        block_size=BLOCK, max_model_len=2 * BLOCK, load_format="dummy")
    await shaped.start()
    try:
        deltas, finish = await _collect(shaped, _chat("dummy-1", "Hello", max_tokens=4))
        assert finish.reason in ("stop", "length")
        assert sum(d.num_tokens for d in deltas) >= 1
        assert shaped.kv_capacity_tokens > 0
    finally:
        await shaped.shutdown()


async def test_stats_collector_accumulates_real_vllm_stats() -> None:
    _require_vllm(need_model=False)
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    from daemon.engines.vllm.adapter import StatsCollector

    collector = StatsCollector()
    for queries, hits, preempted in ((100, 0, 0), (120, 96, 2)):
        sched = SchedulerStats(
            num_running_reqs=3, num_waiting_reqs=1, kv_cache_usage=0.25,
            prefix_cache_stats=PrefixCacheStats(requests=1, queries=queries, hits=hits),
        )
        it = IterationStats()  # type: ignore[no-untyped-call]
        it.num_preempted_reqs = preempted
        it.num_generation_tokens = 3
        collector.record(sched, it)
    c = collector.snapshot()
    assert (c.prefix_cache_queries, c.prefix_cache_hits) == (220, 96)
    assert (c.preemptions, c.steps, c.generated_tokens) == (2, 2, 6)
    assert (c.running, c.waiting, c.kv_cache_usage) == (3, 1, 0.25)


async def test_converted_directory_carries_every_fix() -> None:
    _require_vllm()
    config = json.loads((MODEL_DIR / "config.json").read_text())
    # Readers that ignore rope_parameters must still see SmolLM2's theta, not 10000.
    assert config["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    tok = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>" in tok["chat_template"]
    from safetensors import safe_open

    with safe_open(str(MODEL_DIR / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        assert "lm_head.weight" not in names  # tied: vLLM reuses the embeddings
        assert weights.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"


async def test_seeded_requests_prefilled_together_do_not_kill_the_cpu_engine() -> None:
    """Sixteen seeded 900-token prompts at once: with chunked prefill vLLM's CPU build split
    them and, rewinding a seeded request's generator, died ("CPU Generator does not use
    offset", EngineDeadError for every request). On CPU the worker prefills prompts whole."""
    _require_vllm()
    import random

    from daemon.engines.vllm.engine import VllmEngine

    eng = VllmEngine(str(MODEL_DIR), kv_cache_bytes=512 << 20, block_size=BLOCK,
                     max_model_len=1024, dtype="float32")
    await eng.start()
    try:
        def seeded(i: int) -> Submit:
            rng = random.Random(i)
            return Submit(request_id=f"seeded-{i}", program_id=f"p-seeded-{i}",
                          prompt_token_ids=[rng.randrange(100, 20_000) for _ in range(900)],
                          sampling=SamplingParams(max_tokens=4, temperature=0.7, seed=1234 + i))

        finishes = await asyncio.gather(*(_collect(eng, seeded(i)) for i in range(16)))
        assert [f.reason for _, f in finishes] == ["length"] * 16, [f.error for _, f in finishes]
    finally:
        await eng.shutdown()
