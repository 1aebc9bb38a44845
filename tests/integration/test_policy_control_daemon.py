"""Operator control policies in a real daemon: stored, validated against the sample and
the live view, activated between two periods of the global controller, rolled back when
one raises, kept across a restart, and named by version on every decision it makes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for, wait_for_trace

BUSY_FIRST = '''\
from scheduling.agents.policy import ControlPolicy, set_priority


class BusyFirst(ControlPolicy):
    name = "busy-first"
    period_s = 0.25

    def decide(self, view, now):
        installed = view.rules.priorities
        return [set_priority(s.session_id, float(s.live), reason="most live calls first")
                for s in view.sessions.values()
                if installed.get(s.session_id, 0.0) != s.live]
'''
# Sound on the sample view, whose names have no run prefix; raises on any live view.
BOOM = '''\
from scheduling.agents.policy import ControlPolicy


class Boom(ControlPolicy):
    name = "boom"

    def decide(self, view, now):
        if any("/" in i.instance_id for i in view.instances):
            raise RuntimeError("boom on a live view")
        return []
'''
WORKFLOW = '''import time

import agentd


@agentd.agent(min_instances=1, max_instances=1)
class Worker:
    def work(self, i: int, delay: float) -> int:
        time.sleep(delay)  # calls that take a while: the policy sees them live
        return i


def main(n: int = 4, delay: float = 1.0) -> list[int]:
    w = Worker()
    futures = [w.work(i, delay) for i in range(n)]
    return [int(f) for f in futures]
'''


class ControlDaemon(DaemonProcess):
    def put(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.put(f"{self.url}{path}", json=body, headers=self.auth_headers(),
                         timeout=30)

    def control(self) -> dict[str, Any]:
        return dict(self.get("/v1/control").json())

    def policy_events(self, kind: str) -> list[dict[str, Any]]:
        return list(self.get("/v1/scheduling/trace", params={"kind": kind}).json()["data"])

    def start_run(self, session: str, **args: Any) -> str:
        r = self.post("/v1/runs", json={"workflow": "slow", "session_id": session,
                                        "args": args})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def wait_reported(self, run_id: str) -> float:
        wait_for(lambda: self.get(f"/v1/runs/{run_id}/control").json()["reported"], 30,
                 lambda: f"run {run_id} to report its view\n{self.log()}", interval=0.05)
        return time.time()

    def decisions(self, session: str) -> list[dict[str, Any]]:
        """The control decisions of the session's run, which has ended."""
        rows = wait_for_trace(self, session, "run.finished")
        return [e["data"] for e in rows if e["kind"] == "control.decision"]


@pytest.fixture
def d(tmp_path: Any) -> Iterator[ControlDaemon]:
    daemon = ControlDaemon(tmp_path / "data")
    daemon.start()
    yield daemon
    daemon.stop()


def active_control(d: ControlDaemon) -> tuple[str, int]:
    [row] = [p for p in d.get("/v1/policies").json()["data"]
             if p["layer"] == "control" and p["active"]]
    return row["name"], row["active_version"]


def test_operator_control_policy_lifecycle(d: ControlDaemon) -> None:
    # built-ins are registered and the default runs
    status = d.control()
    assert (status["policy"], status["version"]) == ("nalar-default", 1)
    assert {"nalar-default", "hol-migration", "srtf-stage", "static"} <= set(status["policies"])
    assert active_control(d) == ("nalar-default", 1)

    # store, refuse, validate, activate through the one control endpoint
    bad = d.put("/v1/policies/busy-first", {"layer": "control",
                                            "source": "import socket\n" + BUSY_FIRST})
    assert bad.status_code == 201 and bad.json()["validation"]["errors"][0]["line"] == 1
    r = d.put("/v1/policies/busy-first", {"layer": "control", "source": BUSY_FIRST})
    assert r.status_code == 201 and r.json()["validation"]["ok"], r.text
    assert r.json()["version"] == 2 and r.json()["validation"]["snapshots"] == ["live", "sample"]
    refused = d.put("/v1/control/policy", {"name": "busy-first", "version": 1})
    assert refused.status_code == 422 and "line 1" in refused.json()["error"]["message"]
    checked = d.post("/v1/policies/busy-first/validate", json={"version": 2})
    assert checked.status_code == 200 and checked.json()["validation"]["ok"], checked.text
    wrong = d.put("/v1/control/policy", {"name": "sjf"})  # an ordering policy
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "name"
    r = d.put("/v1/control/policy", {"name": "busy-first"})
    assert r.status_code == 200, r.text
    assert (r.json()["policy"], r.json()["version"]) == ("busy-first", 2)
    assert r.json()["previous"] == {"name": "nalar-default", "version": 1}
    assert r.json()["period_s"] == 0.25 and active_control(d) == ("busy-first", 2)
    validated = [e["data"] for e in d.policy_events("policy.validated")
                 if e["data"]["name"] == "busy-first"]
    assert [(e["version"], e["on"], e["ok"]) for e in validated] == [
        (1, "activate", False), (2, "validate", True), (2, "activate", True)]

    # its decisions name its version; a version that raises on the live view is refused
    r = d.put("/v1/policies/boom", {"layer": "control", "source": BOOM})
    assert r.json()["validation"]["ok"], r.text  # no run is live: only the sample is seen
    assert d.post("/v1/workflows", json={"name": "slow", "files": {"main.py": WORKFLOW},
                                         "entry": "main:main"}).status_code == 201
    run = d.start_run("s-busy")
    d.wait_reported(run)
    live_refusal = d.post("/v1/policies/boom/activate")
    assert live_refusal.status_code == 422, live_refusal.text
    assert "live:decide raised RuntimeError: boom on a live view" in \
        live_refusal.json()["error"]["message"]
    assert d.run_ended(run, 40)["result"] == [0, 1, 2, 3]
    mine = [e for e in d.decisions("s-busy") if e["by"] == "busy-first"]
    assert mine and all(e["policy_version"] == 2 and e["ok"] for e in mine)
    assert mine[0]["decision_kind"] == "SetPriority" and mine[0]["value"] >= 1.0

    # with no run live it passes; the first live step raises and is rolled back
    r = d.post("/v1/policies/boom/activate")
    assert r.status_code == 200 and d.control()["policy"] == "boom", r.text
    run = d.start_run("s-boom", n=3, delay=0.5)
    seen = d.wait_reported(run)
    wait_for(lambda: d.control()["policy"] == "busy-first", 10,
             lambda: f"the rollback to busy-first: {d.control()}", interval=0.05)
    [rolled] = [e for e in d.policy_events("policy.rolled_back") if e["data"]["name"] == "boom"]
    data = rolled["data"]
    assert data["layer"] == "control" and data["automatic"] is True
    assert data["reason"] == "raised RuntimeError: boom on a live view"
    assert (data["restored"], data["restored_version"]) == ("busy-first", 2)
    print(f"rolled back {rolled['ts'] - seen:.3f} s after the first live view was seen")
    assert rolled["ts"] - seen < 0.5 + 0.5  # boom's period, plus the poll and one step
    assert d.run_ended(run, 40)["result"] == [0, 1, 2]
    boom = d.get("/v1/policies/boom").json()
    assert boom["versions"][0]["status"] == "rolled_back" and boom["active_version"] is None
    assert not [e for e in d.decisions("s-boom") if e["by"] == "boom"]

    # a restart keeps the active version; an operator's rollback goes to the default
    d.stop()
    d.start()
    status = d.control()
    assert (status["policy"], status["version"], status["period_s"]) == ("busy-first", 2, 0.25)
    assert active_control(d) == ("busy-first", 2)
    back = d.post("/v1/policies/busy-first/rollback")
    assert back.status_code == 200 and back.json()["active"]["name"] == "nalar-default"
    assert d.control()["policy"] == "nalar-default"
