"""Agent `resources` as reservations on a real daemon with a simulated engine: a
provision that does not fit the run's capacity (its sandbox limits) is refused with the
reason, a kill frees the reservation, a `min_instances` start-up stops at the capacity,
and an agent whose one instance cannot fit at all fails the run with a clear reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for, wait_for_trace

BIG_SRC = '''import time

import agentd


@agentd.agent(min_instances=1, max_instances=3, resources={"memory_mb": 400})
class Big:
    def work(self, i: int) -> int:
        return i


def main(timeout: float = 30.0) -> dict:
    big = Big()
    seen = [big.instances]
    deadline = time.time() + timeout
    # the test provisions (2), kills (1) and provisions again (2)
    while seen[-3:] != [2, 1, 2] and time.time() < deadline:
        n = big.instances
        if n != seen[-1]:
            seen.append(n)
        time.sleep(0.05)  # the sandbox cannot use tests/waiting.py: its own wait on a fact
    return {"seen": seen, "work": [int(big.work(i)) for i in range(4)]}
'''

TOO_BIG_SRC = '''import agentd


@agentd.agent(min_instances=3, max_instances=3, resources={"memory_mb": 400})
class Twin:
    def ping(self) -> str:
        return "pong"


@agentd.agent(resources={"memory_mb": 4096})
class Huge:
    def ping(self) -> str:
        return "pong"


def main() -> str:
    twin = Twin()
    assert twin.instances == 2, twin.instances  # 3 x 400 MiB do not fit 1024 MiB
    assert str(twin.ping()) == "pong"
    return str(Huge().ping())
'''

LIMITS = {"memory_mb": 1024}


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path_factory.mktemp("res") / "data").start()
    yield daemon
    daemon.stop()


def _instances(d: DaemonProcess, run_id: str) -> list[str] | None:
    view = d.get(f"/v1/runs/{run_id}/control").json()
    return sorted(i["instance_id"] for i in view["instances"]) if view["reported"] else None


def _events(d: DaemonProcess, session: str, end: str = "run.finished") -> list[dict[str, Any]]:
    """The trace of the session's run, which has ended with an `end` event."""
    return wait_for_trace(d, session, end)


def test_provision_refused_for_lack_of_capacity_and_kill_frees_it(d: DaemonProcess) -> None:
    files = {"main.py": BIG_SRC}
    r = d.post("/v1/workflows", json={"name": "big", "files": files, "entry": "main:main"})
    assert r.status_code == 201, r.text
    run = d.post("/v1/runs", json={"workflow": "big", "session_id": "s-res",
                                   "limits": LIMITS}).json()
    rid = run["id"]
    wait_for(what="the first view", timeout=20, check=lambda: _instances(d, rid) == ["Big#0"])
    provision = {"kind": "Provision", "agent_type": "Big", "reason": "test"}
    first, second = d.decide(rid, provision, provision)
    assert first["ok"], first
    # 400 + 400 reserved of 1024 MiB: a third instance's 400 do not fit
    assert not second["ok"] and "Big reserves memory_mb=400" in second["reason"]
    assert "224 of the run's memory_mb=1024 is free" in second["reason"]
    wait_for(what="Big#1", timeout=20, check=lambda: _instances(d, rid) == ["Big#0", "Big#1"])
    assert d.decide(rid, {"kind": "Kill", "instance_id": "Big#1"})[0]["ok"]
    wait_for(what="Big#1 gone", timeout=20, check=lambda: _instances(d, rid) == ["Big#0"])
    again = d.decide(rid, provision)[0]  # the kill gave its 400 MiB back
    assert again["ok"], again
    final = d.run_ended(rid, 40)
    assert final["status"] == "finished", final
    assert final["result"] == {"seen": [1, 2, 1, 2], "work": [0, 1, 2, 3]}
    events = _events(d, "s-res")

    def of(kind: str) -> list[dict[str, Any]]:
        return [e["data"] for e in events if e["kind"] == kind]

    decided = [(e["decision_kind"], e["ok"]) for e in of("control.decision")
               if e["by"] == "operator"]
    assert decided == [("Provision", True), ("Provision", False), ("Kill", True),
                       ("Provision", True)]
    refusal = next(e for e in of("control.decision") if e["by"] == "operator" and not e["ok"])
    assert "memory_mb" in refusal["reason"]
    applied = [(e["decision"], e["ok"]) for e in of("control.applied")
               if e["decision"] in ("Provision", "Kill")]
    assert applied == [("Provision", True), ("Kill", True), ("Provision", True)]
    directives = of("agent.directives")[0]
    assert "reservation" in directives["acted_on"]
    assert directives["capacity"]["memory_mb"] == 1024 and directives["capacity"]["GPU"] == 0


def test_start_up_stops_at_capacity_and_an_agent_too_big_fails_the_run(
        d: DaemonProcess) -> None:
    files = {"main.py": TOO_BIG_SRC}
    r = d.post("/v1/workflows", json={"name": "too-big", "files": files, "entry": "main:main"})
    assert r.status_code == 201, r.text
    run = d.post("/v1/runs", json={"workflow": "too-big", "session_id": "s-res2",
                                   "limits": LIMITS}).json()
    final = d.run_ended(run["id"], 40)
    assert final["status"] == "failed", final
    error = final["error"]
    assert error["type"] == "ResourceError" and error["path"] == "main.py:20"
    assert "Huge reserves memory_mb=4096" in error["reason"]
    assert "memory_mb=1024" in error["reason"]
    events = _events(d, "s-res2", "run.failed")
    refused = [e["data"] for e in events if e["kind"] == "control.applied"
               and not e["data"]["ok"]]
    assert [(e["agent_type"], e["reason"]) for e in refused] == [("Twin", "min_instances")]
    assert "224 of the run's memory_mb=1024 is free" in refused[0]["detail"]
    failed = [e["data"] for e in events if e["kind"] == "run.failed"]
    assert failed and "Huge" in failed[0]["reason"]
