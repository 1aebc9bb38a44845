"""The `batchable` directive on a real daemon with a simulated engine: a batchable
agent's one instance runs up to `max_batch` of eight fanned-out calls at once, each
with an LLM program of its own, while its non-batchable twin runs them one at a time.
Concurrency is read from the run's trace (each call's start and end)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess

SRC = '''import agentd


@agentd.agent(batchable=True, max_batch=4, max_instances=1)
class Batched:
    def ask(self, i: int) -> str:
        return agentd.llm(f"question {i}: say something", max_tokens=24)


@agentd.agent(max_instances=1)
class Serial:
    def ask(self, i: int) -> str:
        return agentd.llm(f"question {i}: say something", max_tokens=24)


def main(kind: str, n: int = 8) -> list:
    agent = Batched() if kind == "batched" else Serial()
    futures = [agent.ask(i) for i in range(n)]  # all queued before the first ends
    return [len(str(f)) for f in futures]
'''
N = 8
MAX_BATCH = 4


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path_factory.mktemp("batch") / "data").start()
    try:
        r = daemon.post("/v1/workflows", json={"name": "batch", "files": {"main.py": SRC},
                                               "entry": "main:main"})
        assert r.status_code == 201, r.text
        yield daemon
    finally:
        daemon.stop()


def _run(d: DaemonProcess, kind: str, session: str) -> dict[str, Any]:
    r = d.post("/v1/runs", json={"workflow": "batch", "session_id": session,
                                 "args": {"kind": kind, "n": N}})
    assert r.status_code == 201, r.text
    return d.run_ended(r.json()["id"], 90)


def _calls(d: DaemonProcess, session: str) -> list[dict[str, Any]]:
    """The agent calls of the session's run, as resolved: executor, start, end."""
    rows = d.get(f"/v1/sessions/{session}/trace", params={"limit": 1000}).json()["data"]
    return [r["data"] for r in rows
            if r["kind"] == "future.resolved" and r["data"]["name"].endswith(".ask")]


def _most_at_once(calls: list[dict[str, Any]]) -> int:
    """The most calls running at one moment (an end before a start at the same time)."""
    edges = sorted([(c["started_at"], 1) for c in calls] + [(c["finished_at"], -1)
                                                             for c in calls],
                   key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _llm_programs(d: DaemonProcess, session: str, run: dict[str, Any]) -> set[str]:
    programs = d.get("/v1/programs", params={"session": session, "limit": 100}).json()["data"]
    prefix = run["program_id"] + "."
    return {p["id"][len(prefix):] for p in programs if p["id"].startswith(prefix)}


def test_a_batchable_instance_runs_up_to_max_batch_calls_at_once(d: DaemonProcess) -> None:
    run = _run(d, "batched", "s-batched")
    assert run["status"] == "finished", run
    assert len(run["result"]) == N and all(n > 0 for n in run["result"])
    calls = _calls(d, "s-batched")
    assert len(calls) == N and {c["executor"] for c in calls} == {"Batched#0"}
    assert all(c["status"] == "done" for c in calls), calls
    assert _most_at_once(calls) == MAX_BATCH
    # one LLM program per slot: their requests are separate in the engine's batch
    assert _llm_programs(d, "s-batched", run) == {"Batched.0", "Batched.0.1", "Batched.0.2",
                                                   "Batched.0.3"}


def test_a_non_batchable_twin_runs_them_one_at_a_time(d: DaemonProcess) -> None:
    run = _run(d, "serial", "s-serial")
    assert run["status"] == "finished", run
    calls = _calls(d, "s-serial")
    assert len(calls) == N and {c["executor"] for c in calls} == {"Serial#0"}
    assert _most_at_once(calls) == 1
    ordered = sorted(calls, key=lambda c: c["started_at"])
    assert all(a["finished_at"] <= b["started_at"] for a, b in itertools.pairwise(ordered))
    assert _llm_programs(d, "s-serial", run) == {"Serial.0"}
