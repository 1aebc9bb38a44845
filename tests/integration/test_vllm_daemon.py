"""The whole path on a real engine: openai client → agentd → vLLM worker (CPU) → SmolLM2.

Skipped when vLLM or the converted model is missing, unless AGENTD_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from daemon.models.smollm2 import kv_bytes_per_token
from tests.daemon_process import DaemonProcess
from tests.vllm_support import MODEL_DIR, _require_vllm
from tests.waiting import wait_for

pytestmark = pytest.mark.vllm
KV_BYTES = 64 << 20
FP32_BYTES_PER_TOKEN = kv_bytes_per_token("float32")
BLOCK = 128


def vllm_daemon(data_dir: Path, kv_bytes: int, max_model_len: int,
                block: int = BLOCK, env: dict[str, str] | None = None) -> DaemonProcess:
    _require_vllm()
    return DaemonProcess(data_dir=data_dir, engine="vllm", extra_args=["--model", str(MODEL_DIR)],
                         env={"AGENTD_VLLM_KV_CACHE_BYTES": str(kv_bytes),
                              "AGENTD_VLLM_MAX_MODEL_LEN": str(max_model_len),
                              "AGENTD_VLLM_BLOCK_SIZE": str(block),
                              "AGENTD_HEARTBEAT_TIMEOUT_S": "5", **(env or {})}
                         ).start(timeout=240)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = vllm_daemon(tmp_path_factory.mktemp("vllm") / "data", KV_BYTES, 1024)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=daemon.token, max_retries=0,
                         timeout=120)


def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def worker(d: DaemonProcess) -> dict:  # type: ignore[type-arg]
    [w] = [w for w in d.get("/v1/workers").json()["data"] if w["status"] == "healthy"]
    return w  # type: ignore[no-any-return]


def test_capital_of_france(client: openai.OpenAI, daemon: DaemonProcess) -> None:
    resp = client.chat.completions.create(
        model=model(client), temperature=0, max_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in (resp.choices[0].message.content or "")
    assert worker(daemon)["engine"] == "vllm"


def test_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=model(client), temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Write a Python function that adds two numbers."}])
    chunks = list(stream)
    text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text) >= 5
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20


def test_kv_capacity_is_blocks_times_block_size(daemon: DaemonProcess) -> None:
    w = worker(daemon)
    assert w["block_size"] == BLOCK
    assert w["kv_capacity_tokens"] == (KV_BYTES // FP32_BYTES_PER_TOKEN) // BLOCK * BLOCK
    assert w["stats"]["kv_capacity_tokens"] == w["kv_capacity_tokens"]


def test_prefix_cache_hit_is_reported(client: openai.OpenAI) -> None:
    history = [{"role": "system", "content": "You are a helpful assistant. " * 40},
               {"role": "user", "content": "Name a colour."}]
    first = client.chat.completions.create(model=model(client), messages=history,  # type: ignore[arg-type]
                                           max_tokens=8, temperature=0,
                                           extra_body={"program_id": "p-prefix"})
    history += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                {"role": "user", "content": "Name another one."}]
    second = client.chat.completions.create(model=model(client), messages=history,  # type: ignore[arg-type]
                                            max_tokens=8, temperature=0,
                                            extra_body={"program_id": "p-prefix"})
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details
    assert cached is not None and cached.cached_tokens is not None and cached.cached_tokens > 0


def test_usage_rises_under_load_and_abort_frees_the_request(client, daemon) -> None:  # type: ignore[no-untyped-def]
    stream = client.chat.completions.create(
        model=model(client), max_tokens=400, stream=True, temperature=0,
        messages=[{"role": "user", "content": "Tell me a very long story about a dragon."}])
    peak_running, peak_used = 0, 0
    for i, _chunk in enumerate(stream):
        stats = worker(daemon)["stats"]
        peak_running = max(peak_running, stats["running"])
        peak_used = max(peak_used, stats["kv_used_tokens"])
        if i >= 10:
            break
    stream.close()  # the client goes away mid-stream: agentd aborts the request
    assert peak_running == 1 and peak_used > 0
    stats = wait_for(lambda: (s := worker(daemon)["stats"])["running"] == 0 and s, 15,
                     "the aborted request to leave the engine", interval=0.2)
    assert stats["kv_used_tokens"] == 0


def test_worker_crash_fails_clearly_and_is_restarted(client, daemon) -> None:  # type: ignore[no-untyped-def]
    old = worker(daemon)
    stream = client.chat.completions.create(
        model=model(client), max_tokens=600, temperature=0.8, seed=1, stream=True,
        messages=[{"role": "user", "content": "Tell me a very long story about a dragon."}])
    error = None
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                # Killed mid-generation: no token can arrive after this, not even EOS.
                os.kill(old["pid"], signal.SIGKILL)
                for _ in stream:
                    pass
                break
    except openai.APIError as exc:
        error = str(exc)
    assert error is not None and "no healthy worker" in error
    def restarted() -> bool:
        healthy = [w for w in daemon.get("/v1/workers").json()["data"] if w["status"] == "healthy"]
        return bool(healthy) and healthy[0]["pid"] != old["pid"]

    wait_for(restarted, 180, "the supervisor to restart the vLLM worker", interval=1.0)
    resp = client.chat.completions.create(
        model=model(client), max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert resp.usage is not None and resp.usage.completion_tokens > 0


def test_an_engine_core_that_dies_ends_its_worker_which_is_restarted(
        client: openai.OpenAI, daemon: DaemonProcess) -> None:
    """vLLM runs its engine core in a child process of the worker; when that dies the worker
    process lives on, and every request it took would fail for ever. It exits instead
    (non-zero), its supervisor starts a new one, and the daemon serves again."""
    import psutil

    old = worker(daemon)
    [core] = [p for p in psutil.Process(old["pid"]).children(recursive=True)
              if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]
    core.kill()

    def replaced() -> bool:
        healthy = [w for w in daemon.get("/v1/workers").json()["data"] if w["status"] == "healthy"]
        return bool(healthy) and healthy[0]["pid"] != old["pid"]

    wait_for(replaced, 180, "the worker whose engine died to be replaced", interval=1.0)
    exits = daemon.get("/v1/events", params={"kind": "worker.exited"}).json()["data"]
    assert any("exited with 1" in e["message"] for e in exits), exits
    resp = client.chat.completions.create(
        model=model(client), max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert resp.usage is not None and resp.usage.completion_tokens > 0


def test_small_kv_cache_preempts(tmp_path: Path) -> None:
    # 256 tokens of KV (8 blocks of 32) for 8 concurrent ~120-token requests: the engine
    # must preempt. The daemon's admission fence exists to prevent exactly that, so it is
    # off here: this test is about the engine's own preemption and its metric.
    d = vllm_daemon(tmp_path / "small", 256 * FP32_BYTES_PER_TOKEN, 128, block=32,
                    env={"AGENTD_ADMISSION_POLICY": "unbounded"})
    try:
        c = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0, timeout=120)
        name = model(c)
        # ~60-token prompts (two blocks each, unshared: the number leads) so that the engine
        # admits four and must preempt at their first new block, however early a sampled
        # story ends (with short prompts and early EOS, eight stories fitted in 256 tokens)
        tale = ("The old lighthouse keeper climbed the stairs every evening to light the "
                "lamp, and one stormy night he saw a ship with torn black sails drifting "
                "toward the rocks below, its deck empty and its lanterns dark. He")
        threads = [threading.Thread(target=lambda i=i: c.completions.create(
            model=name, prompt=f"Story number {i}. {tale}", max_tokens=60,
            temperature=0.8, extra_body={"program_id": f"p-small-{i}"})) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        metrics = d.get("/metrics").text
        [line] = [m for m in metrics.splitlines() if m.startswith("vllm:num_preemptions_total{")]
        assert float(line.split()[-1]) > 0
    finally:
        d.stop()
