"""Waiting for resources and GPU capacity on a real daemon with a simulated engine: a
call to an agent with no room now waits (a trace event names the agent and the
resource), is placed when an operator's kill frees room, or fails after the daemon's
`runtime_resource_wait_s` naming agent, resource, need and free; `runtime_gpus`
reaches the sandbox as its GPU capacity."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for, wait_for_trace

WAIT_SRC = '''import time

import agentd


@agentd.agent(min_instances=1, max_instances=2, resources={"memory_mb": 400})
class Holder:
    def ping(self) -> str:
        return "pong"


@agentd.agent(min_instances=0, resources={"memory_mb": 300})
class Late:
    def ping(self, x: int) -> int:
        return x + 1


def main(timeout: float = 30.0) -> dict:
    holder = Holder()
    deadline = time.time() + timeout
    while holder.instances < 2 and time.time() < deadline:  # the test provisions one
        time.sleep(0.05)  # the sandbox cannot use tests/waiting.py: its own wait on a fact
    t0 = time.time()
    first = Late().ping(1)  # 224 of 1024 MiB free: waits
    second = Late().ping(first)  # behind it
    return {"first": int(first), "second": int(second), "waited_s": time.time() - t0}
'''

GPU_SRC = '''import agentd
from agentd import runtime


@agentd.agent(resources={"GPU": 1})
class OnGpu:
    def ping(self) -> str:
        return "pong"


def main() -> dict:
    return {"pong": str(OnGpu().ping()), "gpus": runtime.current().capacity["GPU"]}
'''

LIMITS = {"memory_mb": 1024}
WAIT_S = 6


def _daemon(tmp: Path, gpus: str, wait_s: int = WAIT_S) -> DaemonProcess:
    return DaemonProcess(tmp / "data", env={"AGENTD_RUNTIME_GPUS": gpus,
                                            "AGENTD_RUNTIME_RESOURCE_WAIT_S": str(wait_s)})


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = _daemon(tmp_path_factory.mktemp("wait"), "1").start()
    try:
        # the operator's kills make the room here: the default policy would make it itself
        # (test_workflow_room_policy.py)
        r = daemon.post("/v1/policies/static/activate")
        assert r.status_code == 200, r.text
        for name, src in (("wait", WAIT_SRC), ("gpu", GPU_SRC)):
            r = daemon.post("/v1/workflows", json={"name": name, "files": {"main.py": src},
                                                   "entry": "main:main"})
            assert r.status_code == 201, r.text
        yield daemon
    finally:
        daemon.stop()


def _start(d: DaemonProcess, workflow: str, session: str) -> str:
    r = d.post("/v1/runs", json={"workflow": workflow, "session_id": session,
                                 "limits": LIMITS})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _trace(d: DaemonProcess, session: str, kind: str) -> list[dict[str, Any]]:
    rows = d.get(f"/v1/sessions/{session}/trace", params={"limit": 1000}).json()["data"]
    return [r["data"] for r in rows if r["kind"] == kind]


def _fill(d: DaemonProcess, run_id: str, session: str) -> list[dict[str, Any]]:
    """Provision the second Holder (800 of 1024 MiB reserved); the Late call then waits."""
    def reported() -> bool:
        view = d.get(f"/v1/runs/{run_id}/control").json()
        return bool(view["reported"]) and any(i["instance_id"] == "Holder#0"
                                               for i in view["instances"])

    wait_for(what="the first view", timeout=30, check=reported)
    assert d.decide(run_id, {"kind": "Provision", "agent_type": "Holder"})[0]["ok"]
    return list(wait_for(what="the waiting event", timeout=30,
                         check=lambda: _trace(d, session, "future.waiting")))


def test_a_call_waits_for_room_and_a_kill_places_it(d: DaemonProcess) -> None:
    run_id = _start(d, "wait", "s-wait")
    waiting = _fill(d, run_id, "s-wait")[0]
    assert (waiting["agent_type"], waiting["resource"], waiting["need"], waiting["free"]) == \
        ("Late", "memory_mb", 300, 224)
    assert "Late reserves memory_mb=300" in waiting["reason"] and waiting["wait_s"] == WAIT_S
    # Time passing is what is tested here: the call is still waiting a second later (and
    # says so in `waited_s` below), it neither fails nor runs without room.
    time.sleep(1.0)
    assert d.get(f"/v1/runs/{run_id}").json()["status"] == "running"  # still waiting
    assert d.decide(run_id, {"kind": "Kill", "instance_id": "Holder#1", "reason": "test"})[0]["ok"]
    final = d.run_ended(run_id)
    assert final["status"] == "finished", final
    assert final["result"]["first"] == 2 and final["result"]["second"] == 3
    assert 1.0 < final["result"]["waited_s"] < WAIT_S + 5
    wait_for_trace(d, "s-wait", "run.finished")
    placed = [e for e in _trace(d, "s-wait", "future.placed") if e["agent_type"] == "Late"]
    assert [e["instance"] for e in placed] == ["Late#0", "Late#0"]
    assert all("waiting for resources" in e["reason"] for e in placed)
    assert not _trace(d, "s-wait", "future.wait_expired")


def test_a_wait_that_runs_out_fails_the_run_naming_what_is_short(d: DaemonProcess) -> None:
    run_id = _start(d, "wait", "s-wait-out")
    _fill(d, run_id, "s-wait-out")
    t0 = time.time()
    final = d.run_ended(run_id)
    assert time.time() - t0 >= WAIT_S - 1.5  # it waited before failing
    assert final["status"] == "failed", final
    error = final["error"]
    assert error["type"] == "ResourceError", error
    assert f"agent Late waited {WAIT_S} s for resources and none freed" in error["reason"]
    assert "Late reserves memory_mb=300 per instance" in error["reason"]
    assert "224 of the run's memory_mb=1024 is free" in error["reason"]
    wait_for_trace(d, "s-wait-out", "run.failed")
    expired = _trace(d, "s-wait-out", "future.wait_expired")
    assert expired and expired[0]["agent_type"] == "Late"
    assert (expired[0]["resource"], expired[0]["need"], expired[0]["free"]) == \
        ("memory_mb", 300, 224)


def test_configured_gpus_reach_the_sandbox(d: DaemonProcess) -> None:
    final = d.run_ended(_start(d, "gpu", "s-gpu"))
    assert final["status"] == "finished", final
    assert final["result"] == {"pong": "pong", "gpus": 1}


def test_without_gpus_a_gpu_agent_fails_at_once(tmp_path: Path) -> None:
    d0 = _daemon(tmp_path, "0").start()
    try:
        r = d0.post("/v1/workflows", json={"name": "gpu", "files": {"main.py": GPU_SRC},
                                           "entry": "main:main"})
        assert r.status_code == 201, r.text
        t0 = time.time()
        final = d0.run_ended(_start(d0, "gpu", "s-gpu0"))
        assert time.time() - t0 < WAIT_S  # never fits: no wait
        assert final["status"] == "failed", final
        assert final["error"]["type"] == "ResourceError"
        assert "agent OnGpu reserves GPU=1 per instance, more than the run has in all " \
               "(GPU=0" in final["error"]["reason"]
    finally:
        d0.stop()
