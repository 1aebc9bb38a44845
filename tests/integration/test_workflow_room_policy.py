"""On a real daemon with its default control policy: a call waiting for room is in the
run's reported view with no executor, and the policy (resource reassignment) kills an
idle instance of another agent and provisions the waiting one, with no operator step;
the call runs long before its wait would have run out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess
from tests.integration.test_workflow_resource_wait import (
    WAIT_SRC,
    _start,
    _trace,
)
from tests.waiting import wait_for, wait_for_trace

WAIT_S = 30  # the policy must make room well within it


@pytest.fixture()
def d(tmp_path: Path) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path / "data",
                           env={"AGENTD_RUNTIME_RESOURCE_WAIT_S": str(WAIT_S)}).start()
    try:
        r = daemon.post("/v1/workflows", json={"name": "wait", "files": {"main.py": WAIT_SRC},
                                               "entry": "main:main"})
        assert r.status_code == 201, r.text
        yield daemon
    finally:
        daemon.stop()


def test_the_default_policy_makes_room_for_a_waiting_call(d: DaemonProcess) -> None:
    session = "s-room"
    run_id = _start(d, "wait", session)
    wait_for(what="the first view", timeout=30, check=lambda: any(
        i["instance_id"] == "Holder#0"
        for i in d.get(f"/v1/runs/{run_id}/control").json().get("instances", ())))
    t0 = time.time()
    assert d.decide(run_id, {"kind": "Provision", "agent_type": "Holder"})[0]["ok"]
    final = d.run_ended(run_id)
    assert final["status"] == "finished", final
    assert final["result"]["first"] == 2 and final["result"]["second"] == 3
    assert time.time() - t0 < WAIT_S / 2
    wait_for_trace(d, session, "run.finished")
    assert _trace(d, session, "future.waiting")  # it did wait
    assert not _trace(d, session, "future.wait_expired")
    by_policy = [(e["decision_kind"], e.get("instance_id") or e.get("agent_type"))
                 for e in _trace(d, session, "control.decision")
                 if e["by"] == "nalar-default" and e["ok"]]
    assert ("Provision", "Late") in by_policy, by_policy
    assert any(kind == "Kill" and str(what).startswith("Holder#") for kind, what in by_policy)
    placed = [e for e in _trace(d, session, "future.placed") if e["agent_type"] == "Late"]
    assert placed and all(e["instance"] == "Late#0" for e in placed)
    assert "waiting for resources" in placed[0]["reason"]
