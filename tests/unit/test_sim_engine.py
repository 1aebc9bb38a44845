"""SimEngine through the real asyncio loop, with time scaled down."""

from __future__ import annotations

import asyncio

from daemon.engines.base import Engine
from daemon.engines.sim import tokenizer
from daemon.engines.sim.cost import CostModel
from daemon.engines.sim.engine import SimEngine, request_from_submit
from daemon.workers.protocol import ChatMessage, Finish, SamplingParams, Submit, TokenDelta

COST = CostModel(name="t", c0=0.02, c_prefill=1e-4, c_decode=1e-3, c_attn=0.0)
CHAT = [ChatMessage("system", "You are terse. " * 20), ChatMessage("user", "list files")]


async def collect(engine: SimEngine, submit: Submit) -> tuple[list[TokenDelta], Finish]:
    deltas: list[TokenDelta] = []
    async for item in engine.generate(submit):
        if isinstance(item, Finish):
            return deltas, item
        deltas.append(item)
    raise AssertionError("stream ended without a Finish")


async def test_streams_deltas_and_finish() -> None:
    engine = SimEngine(kv_capacity_tokens=4096, block_size=16, max_batch=8,
                       max_batched_tokens=256, cost_model=COST, time_scale=0.05)
    conforming: Engine = engine  # checked by mypy: SimEngine is what a worker drives
    await conforming.start()
    try:
        first = Submit(request_id="a", program_id="p", messages=CHAT,
                       sampling=SamplingParams(max_tokens=5))
        (deltas, fin), (deltas_b, fin_b) = await asyncio.gather(
            collect(engine, first),
            collect(engine, Submit(request_id="b", program_id="p", prompt="other words",
                                   sampling=SamplingParams(max_tokens=3))),
        )
        n_prompt = len(tokenizer.encode(tokenizer.render_chat(CHAT)))
        assert "".join(d.text for d in deltas) == "sim0 sim1 sim2 sim3 sim4"
        assert deltas[0].prompt_tokens == n_prompt and deltas[0].cached_tokens == 0
        assert all(d.prompt_tokens is None for d in deltas[1:])
        assert (fin.reason, fin.prompt_tokens, fin.output_tokens) == ("length", n_prompt, 5)
        assert fin.ttft_s is not None and fin.ttft_s > 0
        assert "".join(d.text for d in deltas_b) == "sim0 sim1 sim2"
        assert (fin_b.reason, fin_b.output_tokens) == ("length", 3)

        # Next turn: the conversation so far is resident, its full blocks come back cached.
        turn2 = Submit(request_id="c", program_id="p",
                       messages=[*CHAT, ChatMessage("assistant", "sim0 sim1 sim2 sim3 sim4"),
                                 ChatMessage("user", "and now?")],
                       sampling=SamplingParams(max_tokens=2))
        _, fin_c = await collect(engine, turn2)
        assert fin_c.cached_tokens == (n_prompt + 4) // 16 * 16 > 0

        # Abort mid-stream ends the stream with "abort" and frees the request's blocks.
        stream = engine.generate(Submit(request_id="d", program_id="p", prompt="go on",
                                        sampling=SamplingParams(max_tokens=10_000)))
        got = await anext(stream)
        assert isinstance(got, TokenDelta)
        await engine.abort("d")
        rest = [item async for item in stream]
        assert isinstance(rest[-1], Finish) and rest[-1].reason == "abort"
        assert rest[-1].output_tokens >= 1
        stats = engine.stats()
        assert (stats.kv_used_tokens, stats.running, stats.waiting) == (0, 0, 0)
        assert stats.generated_tokens >= 5 + 3 + 2 + 1
        assert stats.prefix_cache_hits == fin_c.cached_tokens

        # After a failover the stream reads on from the continuation.
        deltas_f, _ = await collect(engine, Submit(
            request_id="f", program_id="p", prompt="hi", continuation="sim0 sim1",
            sampling=SamplingParams(max_tokens=2)))
        assert "".join(d.text for d in deltas_f) == " sim2 sim3"

        # A prompt that can never fit is refused with an error Finish, not a hang.
        _, bad = await collect(engine, Submit(request_id="e", program_id="p",
                                              prompt_token_ids=list(range(5000))))
        assert bad.reason == "error" and bad.error
    finally:
        await engine.shutdown()


def test_continuation_and_simulated_eos_are_deterministic() -> None:
    sub = Submit(request_id="x", program_id="p", prompt="hi", continuation="sim0 sim1",
                 sampling=SamplingParams(max_tokens=4))
    req = request_from_submit(sub)
    assert req.prompt_token_ids == tokenizer.encode("hi sim0 sim1") and req.output_offset == 2
    assert req.eos_after is None
    lengths = [
        request_from_submit(
            Submit(request_id=f"r{i}", program_id="p", prompt="hi"), eos_mean_tokens=50
        ).eos_after
        for i in range(200)
    ]
    again = request_from_submit(Submit(request_id="r7", program_id="p", prompt="hi"), 50)
    assert again.eos_after == lengths[7]
    assert all(n is not None and n >= 1 for n in lengths)
    assert len(set(lengths)) > 20  # actually drawn, not one constant
    seeded = [
        request_from_submit(
            Submit(request_id=rid, program_id="p", prompt="hi",
                   sampling=SamplingParams(seed=3)), 50
        ).eos_after
        for rid in ("u", "v")
    ]
    assert seeded[0] == seeded[1]
