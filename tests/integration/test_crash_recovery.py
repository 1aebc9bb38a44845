"""kill -9 of the daemon under load, then a restart on the same data dir and port."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

import httpx
import openai
from sqlalchemy import select

from db.models import TraceEvent
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"
CANARY = '''\
from scheduling.kv.baselines import StickyPolicy


class Canary(StickyPolicy):
    name = "canary"
'''


class Loop:
    """One OpenAI client issuing requests for one program; records what was acknowledged."""

    def __init__(self, d: DaemonProcess, n: int) -> None:
        self.client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0,
                                    timeout=30)
        self.program, self.session = f"p-load-{n}", f"s-load-{n}"
        self.acked: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": "step"}], max_tokens=30,
                    extra_body={"program_id": self.program, "session_id": self.session})
                raw.parse()
                self.acked.append(raw.headers["x-request-id"])
            except openai.APIError:
                return  # the daemon died under us


def _put_policy(d: DaemonProcess, name: str, source: str) -> None:
    r = httpx.put(f"{d.url}/v1/policies/{name}", headers=d.auth_headers(), timeout=30,
                  json={"layer": "kv", "source": source})
    assert r.status_code == 201, r.text
    assert d.post(f"/v1/policies/{name}/activate").status_code == 200


def _policies(d: DaemonProcess) -> dict[str, Any]:
    return {p["name"]: p.get("active_version") for p in d.get("/v1/policies").json()["data"]}


def _lifecycle(d: DaemonProcess) -> list[tuple[str, dict[str, Any]]]:
    t = TraceEvent
    rows = d.store_rows(select(t.kind, t.data).where(
        t.kind.in_(("daemon.started", "daemon.stopped"))).order_by(t.id))
    return [(row.kind, row.data) for row in rows]


def test_kill_9_under_load_then_restart(daemon_factory, daemon_db: str) -> None:  # type: ignore[no-untyped-def]
    """On either store: the SQLite file in the data dir, or a PostgreSQL database."""
    d: DaemonProcess = daemon_factory(workers=2, env={"AGENTD_SIM_TIME_SCALE": "3"},
                                      db=daemon_db).start()
    old_group = d.proc.pid if d.proc else 0
    try:
        _crash_and_recover(d)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old_group, signal.SIGKILL)


def _crash_and_recover(d: DaemonProcess) -> None:
    _put_policy(d, "canary", CANARY)
    policies = _policies(d)
    workers = {w["id"]: w["pid"] for w in d.get("/v1/workers").json()["data"]}
    loops = [Loop(d, n) for n in range(3)]
    for loop in loops:
        loop.thread.start()
    long_stream = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    stream = long_stream.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=3000,
        stream=True, extra_body={"program_id": "p-long", "session_id": "s-long"})
    for n, _chunk in enumerate(stream):
        if n == 10:
            break
    wait_for(lambda: min(len(loop.acked) for loop in loops) >= 2, 20,
             "two answers to each loop", interval=0.05)
    before = {loop.session: d.get(f"/v1/sessions/{loop.session}/trace").json()["data"]
              for loop in loops}
    # The program's page flushes the writer first: the stream's running row is durable.
    wait_for(lambda: [r["status"] for r in d.get("/v1/programs/p-long").json()["requests"]]
             == ["running"], 10, "the stream's running row in the store")
    d.kill()
    for loop in loops:
        loop.stop.set()
        loop.thread.join(10)
    acked = {loop.program: list(loop.acked) for loop in loops}
    assert all(acked.values()), acked

    # Same data dir and port. The local workers died with the daemon (parent-death
    # signal, daemon/workers/local.py): the restart's own take their ids.
    d.start(wait_workers=2, timeout=60)
    seen = {w["id"]: (w["pid"], w["status"]) for w in d.get("/v1/workers").json()["data"]}
    assert {wid: status for wid, (_, status) in seen.items()} == dict.fromkeys(
        workers, "healthy")
    assert not {pid for pid, _ in seen.values()} & set(workers.values())
    assert _policies(d) == policies
    for loop in loops:
        program = d.get(f"/v1/programs/{loop.program}").json()
        finished = {r["id"] for r in program["requests"] if r["status"] == "finished"}
        assert set(acked[loop.program]) <= finished
        assert program["session_id"] == loop.session
        after = d.get(f"/v1/sessions/{loop.session}/trace").json()["data"]
        assert after[: len(before[loop.session])] == before[loop.session]
        _assert_interrupted_marked(program, after)

    long = d.get("/v1/programs/p-long").json()
    assert long["status"] == "ACTING"
    [req] = long["requests"]
    assert req["status"] == "failed" and req["error"] == "interrupted by a daemon restart"
    trace = d.get("/v1/sessions/s-long/trace").json()["data"]
    [gap] = [e for e in trace if e["kind"] == "daemon.recovered"]
    last_before = max(e["ts"] for e in trace if e["id"] < gap["id"])
    assert gap["data"]["gap_from"] == last_before < gap["data"]["gap_to"]
    assert gap["data"]["requests"] == [req["id"]] and gap["data"]["after_crash"] is True

    # Interrupted programs continue with their next request.
    client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
    for program_id in ["p-long", *acked]:
        out = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "again"}], max_tokens=3,
            extra_body={"program_id": program_id})
        assert out.usage is not None and out.usage.completion_tokens == 3
    assert d.get("/v1/programs/p-long").json()["status"] == "ACTING"

    starts = _lifecycle(d)
    assert [k for k, _ in starts] == ["daemon.started", "daemon.started"]
    assert starts[0][1]["after_crash"] is False and starts[1][1]["after_crash"] is True
    assert starts[1][1]["requests_interrupted"] >= 1
    # A clean stop writes daemon.stopped: the next start is not after a crash.
    assert d.stop() == 0
    d.start(wait_workers=0)
    assert _lifecycle(d)[-1][1]["after_crash"] is False


def _assert_interrupted_marked(program: dict[str, Any], trace: list[dict[str, Any]]) -> None:
    """A loop's request that was in flight at the kill is failed, and its gap marked."""
    open_ = [r for r in program["requests"] if r["status"] in ("queued", "running")]
    assert not open_, open_
    failed = [r["id"] for r in program["requests"] if r["status"] == "failed"]
    for r in program["requests"]:
        if r["status"] == "failed":
            assert r["error"] == "interrupted by a daemon restart"
    gaps = [e for e in trace if e["kind"] == "daemon.recovered"]
    assert [r for e in gaps for r in e["data"]["requests"]] == failed
