"""Bounded fuzzing of a real daemon: its OpenAPI surface and its worker socket."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import msgspec
import openai
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings

from daemon.workers import protocol
from tests.daemon_process import DaemonProcess
from tests.worker_socket import worker_key

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

MODEL = "sim-llama3-8b"
CASES_PER_OPERATION = int(os.environ.get("AGENTD_FUZZ_CASES", "50"))
# It stops the daemon by design; test_drain.py covers it.
NOT_FUZZED = {("POST", "/v1/admin/drain")}


def _chat(d: DaemonProcess, program: str, max_tokens: int = 3) -> int:
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0, timeout=30)
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens,
        extra_body={"program_id": program})
    assert out.usage is not None
    return out.usage.completion_tokens


def _fuzz_operation(d: DaemonProcess, operation: Any, counter: list[int]) -> None:
    headers = d.auth_headers()

    @settings(max_examples=CASES_PER_OPERATION, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        counter[0] += 1
        response = case.call(base_url=d.url, headers=headers, timeout=15)
        assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
        if response.status_code < 300:
            case.validate_response(response, checks=[response_schema_conformance],
                                   headers=headers)
        elif response.headers.get("content-type", [""])[0].startswith("application/json"):
            # Errors keep the API's own OpenAI shape (the published schema still shows
            # Litestar's {status_code, detail} for them: reported, not checked here).
            error = response.json()["error"]
            assert error["message"] and error["type"], response.text[:300]

    run()


def test_openapi_fuzz_finds_no_5xx_and_no_schema_violation(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1).start()
    schema = schemathesis.openapi.from_url(f"{d.url}/schema/openapi.json",
                                           headers=d.auth_headers())
    operations = [r.ok() for r in schema.get_all_operations()]
    fuzzed, failures, counter = 0, [], [0]
    started = time.time()
    for op in operations:
        if (op.method.upper(), op.path) in NOT_FUZZED:
            continue
        fuzzed += 1
        try:
            _fuzz_operation(d, op, counter)
        except (Exception, BaseExceptionGroup) as exc:  # one report lists every failure
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:600]}")
    print(f"fuzzed {fuzzed} operations, {counter[0]} cases in {time.time() - started:.1f}s")
    assert not failures, "\n\n".join(failures)
    assert fuzzed >= 20 and counter[0] >= fuzzed * 2
    assert d.get("/healthz").json()["status"] == "ok"
    assert _chat(d, "p-after-fuzz") == 3


def _garbage_frames(rng: random.Random) -> list[list[bytes]]:
    enc = msgspec.msgpack.encode
    frames: list[list[bytes]] = [[rng.randbytes(rng.randint(0, 300))] for _ in range(40)]
    frames += [
        [b""], [b"", b"", b""], [b"\x00" * 200_000],
        [enc({"type": "nonsense", "worker_id": "x"})],
        [enc({"type": "submit", "request_id": "r"})],  # a daemon->worker tag
        [enc({"type": "heartbeat", "worker_id": 5, "stats": "full"})],
        [enc({"type": "delta", "request_id": ["r"], "text": 1, "num_tokens": "9"})],
        [enc({"type": "finish", "request_id": "nope", "reason": "stop", "prompt_tokens": -1,
              "cached_tokens": 0, "output_tokens": 0})],
        [enc({"type": "register", "worker_id": "fuzz", "engine": "sim"})],
        [enc(["register", 1, 2, 3])], [enc(12345)], [enc(None)],
        [protocol.encode(protocol.Register(
            worker_id="fuzz", engine="sim", model=MODEL, kv_capacity_tokens=1, block_size=1,
            max_batch=1, schema_hash="0" * 16))],  # wrong schema hash
        [protocol.encode(protocol.Register(
            worker_id="someone-else", engine="sim", model=MODEL, kv_capacity_tokens=1,
            block_size=1, max_batch=1, schema_hash=protocol.SCHEMA_HASH))],  # id != identity
        [protocol.encode(protocol.TokenDelta(request_id="req-x", text="t", num_tokens=1))],
    ]
    return frames


def test_malformed_worker_frames_do_not_crash_the_daemon(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1).start()
    rng = random.Random(1234)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"fuzz")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{d.data_dir / 'workers.sock'}")
    frames = _garbage_frames(rng)
    try:
        for frame in frames:
            sock.send_multipart(frame)
        # Keep it up while real traffic runs, so frames interleave with real work.
        stop = threading.Event()

        def keep_sending() -> None:
            while not stop.wait(0.002):
                sock.send_multipart(rng.choice(frames))

        thread = threading.Thread(target=keep_sending, daemon=True)
        thread.start()
        assert [_chat(d, f"p-frames-{n}") for n in range(5)] == [3] * 5
        stop.set()
        thread.join(5)
    finally:
        sock.close()
        ctx.term()
    health = d.get("/healthz").json()
    assert health["status"] == "ok" and health["workers_healthy"] == 1
    assert [w["id"] for w in d.get("/v1/workers").json()["data"]] == ["local-sim-0"]
    assert "Traceback" not in d.log()


def test_a_stuck_worker_does_not_stall_requests(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=1).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"stuck-0")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{d.data_dir / 'workers.sock'}")
    try:
        # Registers with lots of room (so the KV policy likes it), then goes silent.
        sock.send(protocol.encode(protocol.Register(
            worker_id="stuck-0", engine="sim", model=MODEL, kv_capacity_tokens=10_000_000,
            block_size=16, max_batch=256, schema_hash=protocol.SCHEMA_HASH, pid=1,
            key=worker_key(d))))
        ack = protocol.decode_from_daemon(sock.recv())
        assert isinstance(ack, protocol.RegisterAck) and ack.accepted
        started = time.time()
        results: list[int] = []
        threads = [threading.Thread(target=lambda n=n: results.append(_chat(d, f"p-st-{n}")))
                   for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        elapsed = time.time() - started
    finally:
        sock.close()
        ctx.term()
    assert results == [3] * 8
    # The heartbeat timeout is 1.5 s in tests: stranded requests move within a few seconds.
    assert elapsed < 10, elapsed
    programs = [d.get(f"/v1/programs/p-st-{n}").json() for n in range(8)]
    moved = [p["id"] for p in programs if p["requests"][0]["failovers"] > 0]
    assert moved, "no request went to the stuck worker: the test proved nothing"
    assert all(p["worker_id"] == "local-sim-0" for p in programs)
    [stuck] = [w for w in d.get("/v1/workers").json()["data"] if w["id"] == "stuck-0"]
    assert stuck["status"] != "healthy"
