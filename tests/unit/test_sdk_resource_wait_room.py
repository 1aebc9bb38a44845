"""The waiting room through the SDK host (agentd/instances.py): a waiting call whose
dependency fails gets its DependencyError at once, not after the wait for room; and
waiting calls reach the daemon's global view (the wire format, parsed as the daemon
does), where the default reassignment policy makes room for them."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest

import agentd
from agentd import DependencyError
from daemon.runtime.global_controller import RunView, WireView, joined_view, parse_view
from scheduling.agents.policies import ResourceReassignment
from scheduling.agents.policy import GlobalController, Kill, Provision, decision_to_dict

CAP = {"memory_mb": 1024.0, "CPU": 2.0, "GPU": 0.0}
WAIT_S = 30.0  # far longer than any of these tests takes


# Set once the calls that depend on `boom` wait for room: only then does it fail.
BOOM_GATE = threading.Event()


@agentd.agent(min_instances=1, max_instances=2, resources={"memory_mb": 400})
class Keeper:
    def boom(self) -> int:
        assert BOOM_GATE.wait(10)
        raise ValueError("boom")

    def ping(self) -> str:
        return "pong"


@agentd.agent(min_instances=0, resources={"memory_mb": 300})
class Parked:
    def ping(self, x: int) -> int:
        return x + 1


def _full(rt: agentd.runtime.LocalRuntime) -> Keeper:
    keeper = Keeper()
    assert agentd.as_stub(keeper).instances == 1
    assert rt.control.apply([{"kind": "Provision", "agent_type": "Keeper"}])[0].ok
    assert agentd.as_stub(keeper).instances == 2  # 800 of 1024 MiB: no room for a Parked
    return keeper


def test_a_waiting_call_whose_dependency_fails_fails_at_once() -> None:
    with agentd.local_runtime(capacity=CAP, resource_wait_s=WAIT_S) as rt:
        bad = _full(rt).boom()
        parked = Parked().ping(bad)  # waits for room, and for `bad`
        after = Parked().ping(parked)  # behind it, for it
        assert rt.control.cluster.waiting() == 2
        BOOM_GATE.set()
        t0 = time.perf_counter()
        with pytest.raises(DependencyError, match=r"did not run: its dependency .* failed"):
            agentd.as_future(parked).value(timeout=10)
        with pytest.raises(DependencyError):
            agentd.as_future(after).value(timeout=10)
        assert time.perf_counter() - t0 < 5
        assert not rt.control.cluster.waiting()
    failed = [e for e in rt.events if e["event"] == "future.dependency_failed"]
    ids = [agentd.as_future(f).id for f in (bad, parked, after)]
    assert [(e["id"], e["dependency"]) for e in failed] == [(ids[1], ids[0]), (ids[2], ids[1])]
    assert not [e for e in rt.events if e["event"] == "future.wait_expired"]


def test_the_daemon_policy_sees_a_waiting_call_and_makes_room_for_it() -> None:
    with agentd.local_runtime(capacity=CAP, resource_wait_s=WAIT_S) as rt:
        _full(rt)
        parked = agentd.as_future(Parked().ping(1))
        wire = msgspec.convert(rt.control.snapshot(), WireView)
        [f] = [f for f in wire.futures if f.agent_type == "Parked"]
        assert f.executor is None and f.status == "queued"
        # as the daemon sees it: every run's view joined, names prefixed by the run
        view = joined_view({"r1": RunView(parse_view(wire), time.time())})
        assert list(view.waiting_for_room()) == ["r1/Parked"]
        step = GlobalController(ResourceReassignment()).step(view, time.time())
        assert not step.rejected
        kill, prov = step.accepted
        assert isinstance(kill, Kill) and isinstance(prov, Provision)
        assert kill.instance_id.startswith("r1/Keeper#") and prov.agent_type == "r1/Parked"
        local = [decision_to_dict(kill) | {"instance_id": kill.instance_id.split("/")[1]},
                 decision_to_dict(prov) | {"agent_type": "Parked"}]
        assert all(a.ok for a in rt.control.apply(local))
        assert int(parked.value(timeout=10)) == 2
