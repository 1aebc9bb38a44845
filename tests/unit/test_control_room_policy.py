"""Calls waiting for room in the global view, and the reassignment policy making room
for them (scheduling/agents/policies/room.py): it kills an idle instance of another
type, within min_instances, so that the waiting call's instance fits."""

from __future__ import annotations

from scheduling.agents.cluster import Cluster
from scheduling.agents.policies import ResourceReassignment, nalar_default
from scheduling.agents.policy import (
    ControlDecision,
    ControlView,
    Directives,
    FutureStatus,
    FutureView,
    GlobalController,
    InstanceView,
    Kill,
    Provision,
    Route,
)
from scheduling.agents.waiting import WAITING_ROOM
from tests.unit.test_control_waiting import AGENTS, CAP, full, run_all


def plan(view: ControlView, now: float, budget: int | None = None) -> list[ControlDecision]:
    step = GlobalController(ResourceReassignment(budget=budget)).step(view, now)
    assert not step.rejected, step.rejected  # the validator takes the plan whole
    return list(step.accepted)


def shape(decisions: list[ControlDecision]) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.instance_id if isinstance(d, Kill) else d.agent_type)
            for d in decisions if isinstance(d, Kill | Provision)]


def test_waiting_calls_are_in_the_view_with_no_executor() -> None:
    c = full()
    c.create("late", "s", "Late", 1.0)
    c.create("chat", "t", "Chat", 1.5)
    c.create("late2", "s", "Late", 2.0)
    view = c.view(3.0)
    waiting = view.waiting_for_room()
    assert {t: [f.future_id for f in fs] for t, fs in waiting.items()} == \
        {"Late": ["late", "late2"], "Chat": ["chat"]}
    assert all(f.executor is None and f.status is FutureStatus.QUEUED
               for fs in waiting.values() for f in fs)
    assert sum(i.load for i in view.instances) == 0  # no instance's load shows them
    assert view.sessions["s"].live == 2 and view.sessions["t"].live == 1
    assert c.apply([Kill("Holder#1")], 4.0)[0].ok  # placed: no longer waiting
    assert c.view(4.0).waiting_for_room() == {}


def test_reassign_kills_an_idle_instance_of_another_type_for_a_waiting_call() -> None:
    c = full()
    c.create("busy", "s", "Holder", 0.0)
    assert c.start_next("Holder#0", 0.0) is not None
    assert c.create("late", "s", "Late", 1.0) == WAITING_ROOM
    decisions = plan(c.view(2.0), 2.0)
    # the idle Holder goes, not the busy one; one Holder stays (min_instances)
    assert shape(decisions) == [("Kill", "Holder#1"), ("Provision", "Late")]
    assert "1 call(s) of Late waiting for room" in decisions[-1].reason
    assert all(a.ok for a in c.apply(decisions, 2.0))
    assert c.waiting() == 0 and run_all(c, 3.0) == ["late"]


def test_the_default_policy_makes_room_too() -> None:
    c = full()
    c.create("late", "s", "Late", 1.0)
    step = GlobalController(nalar_default()).step(c.view(2.0), 2.0)
    assert ("Provision", "Late") in shape(list(step.accepted))


def test_no_kill_below_min_instances_nor_of_an_instance_holding_a_session() -> None:
    c = Cluster(AGENTS, capacity={"memory_mb": 512}, resource_wait_s=5.0)
    c.add_instance("Holder")  # its type's only one: min_instances 1
    c.create("late", "s", "Late", 1.0)
    assert plan(c.view(2.0), 2.0) == []
    c = full()
    assert c.apply([Route("Holder", "Holder#1", "s")], 0.0)[0].ok  # its state is there
    c.create("busy", "t", "Holder", 0.0)
    assert c.start_next("Holder#0", 0.0) is not None
    c.create("late", "t", "Late", 1.0)
    assert shape(plan(c.view(2.0), 2.0)) == [("Kill", "Holder#0"), ("Provision", "Late")]


def test_only_instances_that_hold_the_missing_resource_are_killed() -> None:
    agents = {"Holder": Directives(min_instances=1, max_instances=2,
                                   resources={"memory_mb": 400}),
              "Gpu": Directives(min_instances=1, max_instances=2, resources={"GPU": 0.5}),
              "NeedsGpu": Directives(min_instances=0, resources={"GPU": 0.5})}
    c = Cluster(agents, capacity={**CAP, "GPU": 1.0}, resource_wait_s=5.0)
    for t in ("Holder", "Holder", "Gpu", "Gpu"):
        c.add_instance(t)
    c.create("busy", "s", "Gpu", 0.0)  # on Gpu#0; the Holders are idle
    assert c.start_next("Gpu#0", 0.0) is not None
    c.create("g", "s", "NeedsGpu", 1.0)
    assert shape(plan(c.view(2.0), 2.0)) == [("Kill", "Gpu#1"), ("Provision", "NeedsGpu")]


def test_the_type_waiting_longest_gets_the_room_first() -> None:
    agents = {**AGENTS, "Mid": Directives(min_instances=0, resources={"memory_mb": 400})}
    for first, second in (("Mid", "Late"), ("Late", "Mid")):
        c = Cluster(agents, capacity=CAP, resource_wait_s=5.0)
        c.add_instance("Holder")
        c.add_instance("Holder")
        c.create("a", "s", first, 1.0)
        c.create("b", "s", second, 2.0)
        # one Holder can go: 624 MiB, room for the first only (Mid 400 + Late 300)
        assert shape(plan(c.view(3.0), 3.0)) == [("Kill", "Holder#0"), ("Provision", first)]


def test_a_type_whose_calls_are_not_ready_yet_comes_after_one_with_a_ready_call() -> None:
    agents = {**AGENTS, "Mid": Directives(min_instances=0, resources={"memory_mb": 400})}
    c = Cluster(agents, capacity=CAP, resource_wait_s=5.0)
    c.add_instance("Holder")
    c.add_instance("Holder")
    c.create("dep", "s", "Holder", 0.0)
    assert c.start_next("Holder#0", 0.0) is not None  # Mid's call waits for its value
    c.create("a", "s", "Mid", 1.0, deps=("dep",))
    c.create("b", "t", "Late", 2.0)
    # room for one of the two: the ready Late gets it, though the Mid call is older
    assert shape(plan(c.view(3.0), 3.0)) == [("Kill", "Holder#1"), ("Provision", "Late")]


def test_a_budget_makes_the_provision_a_swap() -> None:
    """No capacity named: the operator's instance budget is what bounds them."""
    agents = {"Holder": Directives(min_instances=1, max_instances=2),
              "Late": Directives(min_instances=0)}
    instances = [InstanceView(f"Holder#{i}", "Holder") for i in range(2)]
    late = FutureView("late", "s", "Late", None, FutureStatus.QUEUED, 1.0, queued_at=1.0)
    view = ControlView([late], instances, agents)
    assert shape(plan(view, 2.0, budget=3)) == [("Provision", "Late")]
    assert shape(plan(view, 2.0, budget=2)) == [("Kill", "Holder#0"), ("Provision", "Late")]
