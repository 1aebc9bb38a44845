"""The KV layer honours a context's hints on a real daemon whose one sim worker has little KV:
a pinned context's program is never paused, one inside `with ctx.idle():` is ACTING and may
be paused, then restored for its next generate; and the trace shows what contexts did."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import agentd
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
CONTEXT = "a long context words " * 150  # 600 tokens on the sim tokenizer
GUIDE = "the guide of tools " * 150
LOAD_PROGRAMS = 8  # of 600 tokens each: with the two under test, 6000 tokens want 2048


@pytest.fixture
def small_kv(daemon_factory: Callable[..., DaemonProcess],
             monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonProcess]:
    d = daemon_factory(workers=1, env={"AGENTD_SIM_KV_TOKENS": "2048"}).start()
    monkeypatch.setenv("AGENTD_URL", d.url)
    monkeypatch.setenv("AGENTD_TOKEN", d.token)
    with agentd.local_runtime():
        yield d


def _trace(d: DaemonProcess, session: str) -> list[dict[str, Any]]:
    return list(d.get(f"/v1/sessions/{session}/trace", params={"limit": 5000}).json()["data"])


def _kinds(d: DaemonProcess, session: str) -> list[str]:
    return [e["kind"] for e in _trace(d, session)]


def _load(d: DaemonProcess, n: int, stop: list[bool]) -> int:
    """One program wanting KV: generates on its 600-token context until told to stop.
    (A turn may wait for admission for the KV policy's force-resume bound: no 30 s cap.)"""
    steps = 0
    while not stop[0] or steps == 0:
        r = httpx.post(f"{d.url}/v1/contexts/generate", headers=d.auth_headers(),
                       timeout=120, json={
            "model": MODEL, "program_id": f"load-{n}", "session_id": f"s-load-{n}",
            "segments": [{"kind": "turn", "role": "user", "text": CONTEXT + str(steps)}],
            "max_tokens": 16})
        assert r.status_code == 200, r.text
        steps += 1
    return steps


def test_a_pinned_context_stays_resident_and_an_idle_one_is_paused_then_restored(
        small_kv: DaemonProcess) -> None:
    d = small_kv
    pinned = agentd.Context(MODEL, program_id="p-pinned", session_id="s-pinned").user(CONTEXT)
    pinned.generate(max_tokens=2)
    pinned.pin()
    idle = agentd.Context(MODEL, program_id="p-idle", session_id="s-idle").user(CONTEXT)
    idle.generate(max_tokens=2)

    stop = [False]
    with ThreadPoolExecutor(LOAD_PROGRAMS) as pool:
        try:
            with idle.idle():
                assert d.get("/v1/programs/p-idle").json()["status"] == "ACTING"
                loads = [pool.submit(_load, d, n, stop) for n in range(LOAD_PROGRAMS)]
                wait_for(lambda: "kv.pause" in _kinds(d, "s-idle"), 60,
                         "the KV layer pausing the idle context's program under pressure")
                assert d.get("/v1/programs/p-idle").json()["status"] == "PAUSED"
                # The same pressure reached the pinned program: others were paused too.
                wait_for(lambda: any("kv.pause" in _kinds(d, f"s-load-{n}")
                                     for n in range(LOAD_PROGRAMS)), 60,
                         "a load program paused: the worker's KV is contended")
        finally:
            stop[0] = True
        assert all(f.result(timeout=120) > 0 for f in loads)

    pinned_events = _trace(d, "s-pinned")
    assert not [e for e in pinned_events if e["kind"] in ("kv.pause", "kv.mark_pause")]
    assert "PAUSED" not in [e["data"].get("new") for e in pinned_events
                            if e["kind"] == "program.status"]
    assert d.get("/v1/programs/p-pinned").json()["status"] != "PAUSED"

    # After the tool wait the idle context generates again: the KV layer restored it.
    out = idle.user("the tool answered").generate(max_tokens=3)
    assert len(out.token_ids) == 3
    kinds = _kinds(d, "s-idle")
    assert kinds.index("context.idle.start") < kinds.index("kv.pause") \
        < kinds.index("context.idle.end")
    assert "kv.restore" in kinds[kinds.index("kv.pause"):]
    assert pinned.user("still here").generate(max_tokens=2).finish_reason == "length"


def _cached(d: DaemonProcess, program: str) -> int | None:
    residency = d.get(f"/v1/programs/{program}").json().get("kv_residency") or {}
    return residency.get("cached_tokens") if residency.get("source") == "events" else None


def test_a_snapshot_gone_cold_is_filled_again_where_its_opener_runs(
        small_kv: DaemonProcess) -> None:
    d = small_kv
    # Not CONTEXT: the load's contexts would share its blocks and keep them cached.
    author = agentd.Context(MODEL, program_id="p-author", session_id="s-author").user(GUIDE)
    author.generate(max_tokens=2)
    author.snapshot("guide")
    tokens = len(author.token_ids)
    # The opener runs on the worker (pinned: it keeps its home under the load below).
    opener = agentd.Context(MODEL, program_id="p-opener", session_id="s-opener").user("hi")
    opener.generate(max_tokens=2)
    opener.pin()

    # Warm: the author's report says its context (the snapshot) is cached: no fill.
    wait_for(lambda: (_cached(d, "p-author") or 0) >= tokens - 16, 30,
             "the worker reporting the snapshot's blocks cached (KV events)")
    warm = d.get("/v1/contexts/snapshots/guide",
                 params={"program_id": "p-opener", "session_id": "s-opener"}).json()["warm"]
    assert warm["filling"] is False and warm["cached_tokens"] >= tokens - 16

    # Other programs' contexts evict it; the engine's events say so.
    stop = [False]
    with ThreadPoolExecutor(LOAD_PROGRAMS) as pool:
        try:
            loads = [pool.submit(_load, d, n, stop) for n in range(LOAD_PROGRAMS)]
            wait_for(lambda: _cached(d, "p-author") == 0, 60,
                     lambda: f"the snapshot's blocks evicted under the load: "
                     f"{d.get('/v1/programs/p-author').json()}")
        finally:
            stop[0] = True
        assert all(f.result(timeout=120) > 0 for f in loads)

    # Opened cold: the daemon fills it on the opener's worker; the generate starts warm.
    ctx = agentd.Context.open("guide", program_id="p-opener", session_id="s-opener")
    opened = [e for e in _trace(d, "s-opener") if e["kind"] == "context.open"]
    assert opened[-1]["data"]["filling"] is True, opened[-1]
    assert opened[-1]["data"]["cached_tokens"] < tokens - 16
    out = ctx.user("what does the guide say").generate(max_tokens=2)
    filled = [e for e in _trace(d, "s-opener") if e["kind"] == "context.warm"]
    assert len(filled) == 1 and filled[0]["data"]["tokens"] == tokens
    assert "error" not in filled[0]["data"]
    assert filled[0]["worker_id"] == opened[-1]["worker_id"] == "local-sim-0"
    assert out.cached_tokens >= tokens // 16 * 16 - 16, (out.cached_tokens, tokens)
    assert out.shared_prefix_tokens == tokens
