"""Resource reservations (scheduling/agents/resources.py) in the cluster, the global
controller's validation and the daemon's joined view; batch slots; and the migration
property test again with batchable agents under a capacity."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.runtime.global_controller import RunView, joined_view
from scheduling.agents.cluster import Cluster
from scheduling.agents.policy import (
    ControlView,
    Directives,
    InstanceState,
    InstanceView,
    Kill,
    Provision,
    Route,
    Validator,
)
from scheduling.agents.resources import NoCapacity, never_fits, shortfall
from tests.unit.test_control_migration import World, op

BIG = Directives(min_instances=1, max_instances=4, resources={"memory_mb": 400, "CPU": 1})
CAP = {"memory_mb": 1024, "CPU": 2, "GPU": 0}


def test_shortfall_names_the_resource_and_what_is_free() -> None:
    assert shortfall("W", {"memory_mb": 400}, {"memory_mb": 600}, CAP) is None
    why = shortfall("W", {"memory_mb": 400}, {"memory_mb": 800}, CAP)
    assert why is not None and "memory_mb=400" in why and "224" in why and "1024" in why
    # a run has no GPU unless it is given one; fractional shares add up exactly
    assert "GPU" in (shortfall("W", {"GPU": 0.5}, {}, CAP) or "")
    assert shortfall("W", {"GPU": 0.1}, {"GPU": 0.2}, {"GPU": 0.3}) is None
    assert shortfall("W", {"memory_mb": 0}, {"memory_mb": 2048}, CAP) is None
    assert never_fits("W", {"memory_mb": 400}, CAP) is None
    too_big = never_fits("Huge", {"memory_mb": 4096}, CAP)
    assert too_big is not None and "Huge" in too_big and "4096" in too_big


def test_cluster_refuses_a_provision_that_does_not_fit_and_kill_frees_it() -> None:
    c = Cluster({"Big": BIG}, capacity=CAP)
    c.add_instance("Big")
    done = c.apply([Provision("Big"), Provision("Big")], 1.0)
    assert [a.ok for a in done] == [True, False]
    # the validator counts the first provision of the batch before judging the second
    assert "224 of the run's memory_mb=1024 is free" in done[1].detail
    assert c.reserved == {"memory_mb": 800, "CPU": 2}
    refused = [e for e in c.take_events() if e["event"] == "control.applied" and not e["ok"]]
    assert len(refused) == 1 and refused[0]["decision"] == "Provision"
    assert refused[0]["detail"] == done[1].detail
    assert c.apply([Kill("Big#1")], 2.0)[0].ok
    assert c.reserved == {"memory_mb": 400, "CPU": 1}  # at the kill, not when it is reaped
    assert c.apply([Provision("Big")], 3.0)[0].ok
    assert sorted(x.id for x in c.alive("Big")) == ["Big#0", "Big#2"]
    with pytest.raises(NoCapacity, match="Big reserves memory_mb=400"):
        c.add_instance("Big")  # direct additions are held to the same capacity


def test_no_capacity_means_unbounded() -> None:
    c = Cluster({"Big": BIG})
    for _ in range(4):
        c.add_instance("Big")
    assert c.room_for("Big") is None and len(c.alive("Big")) == 4


def test_min_instances_start_up_stops_at_the_capacity_with_an_event() -> None:
    c = Cluster(capacity={"memory_mb": 1000})
    c.add_agent("Twin", Directives(min_instances=3, max_instances=3,
                                   resources={"memory_mb": 400}))
    assert c.provision_startup("Twin", 3) == 2
    events = c.take_events()
    assert [e["event"] for e in events] == ["instance.provisioned"] * 2 + ["control.applied"]
    last = events[-1]
    assert not last["ok"] and last["reason"] == "min_instances"
    assert "200 of the run's memory_mb=1000 is free" in last["detail"]


def test_growth_on_demand_stays_within_the_capacity() -> None:
    grow = Directives(max_instances=4, resources={"memory_mb": 400})
    c = Cluster({"G": grow}, grow_on_demand=True, capacity=CAP)
    for i in range(5):
        c.create(f"f{i}", "s", "G", float(i))
    assert len(c.alive("G")) == 2  # 800 of 1024 reserved; the rest queue on those two
    assert sum(x.load for x in c.alive("G")) == 5
    # an agent with no instance and no room: the call is refused, nothing recorded
    c.add_agent("H", Directives(min_instances=0, resources={"memory_mb": 300}))
    with pytest.raises(NoCapacity, match="no live instance of H"):
        c.create("h0", "s", "H", 9.0)
    assert not c.knows("h0")


def test_global_validation_counts_kills_and_provisions_of_one_step() -> None:
    agents = {"Big": BIG, "Small": Directives(max_instances=4, resources={"memory_mb": 100})}
    inst = [InstanceView("Big#0", "Big"), InstanceView("Big#1", "Big"),
            InstanceView("Small#0", "Small"),
            InstanceView("Big#9", "Big", state=InstanceState.DRAINING)]  # killed: reserves 0
    view = ControlView((), inst, agents, capacity={"": CAP | {"CPU": 4}})
    assert view.reserved("") == {"memory_mb": 900, "CPU": 2}
    v = Validator(view)
    assert v.check(Provision("Small")) is None  # 1000
    assert "Big reserves memory_mb=400" in (v.check(Provision("Big")) or "")
    assert v.check(Kill("Big#1")) is None  # frees 400 at once: reassignment in one step
    assert v.check(Provision("Big")) is None
    assert v.check(Provision("Small")) is not None
    unbounded = ControlView((), inst, agents)
    assert Validator(unbounded).check(Provision("Big")) is None


def test_joined_view_keeps_each_runs_capacity_apart() -> None:
    def run(n_big: int) -> RunView:
        inst = [InstanceView(f"Big#{i}", "Big") for i in range(n_big)]
        return RunView(ControlView((), inst, {"Big": BIG}, capacity={"": CAP}), 0.0)

    joined = joined_view({"r1": run(2), "r2": run(1)})
    assert joined.pool_of("r1/Big") == "r1" and joined.capacity["r2"] == CAP
    v = Validator(joined)
    assert v.check(Provision("r1/Big")) is not None  # r1 is full
    assert v.check(Provision("r2/Big")) is None  # r2 has its own 1024 MiB


def test_batchable_instances_take_max_batch_calls_at_once() -> None:
    c = Cluster({"B": Directives(batchable=True, max_batch=3), "N": Directives()})
    b, n = c.add_instance("B"), c.add_instance("N")
    assert (b.slots, n.slots) == (3, 1)
    for i in range(5):
        c.create(f"b{i}", "s", "B", 0.0)
        c.create(f"n{i}", "s", "N", 0.0)
    started = {inst: [] for inst in ("B#0", "N#0")}  # type: dict[str, list[str]]
    for inst in started:
        while (s := c.start_next(inst, 1.0)) is not None:
            started[inst].append(s.future.future_id)
    assert started == {"B#0": ["b0", "b1", "b2"], "N#0": ["n0"]}
    c.finish("B#0", "b1", None, True, 2.0)
    assert c.start_next("B#0", 2.0) is not None and c.start_next("B#0", 2.0) is None


# --- the migration property test, with batchable agents under a capacity ---------------

BATCH_AGENTS = {
    "A": Directives(batchable=True, max_batch=3, max_instances=5, resources={"memory_mb": 100}),
    "B": Directives(max_instances=4, resources={"memory_mb": 100}),
    "S": Directives(stateful=True, batchable=True, max_batch=2, max_instances=2,
                    resources={"memory_mb": 50})}
BATCH_CAP = {"memory_mb": 700}


class BatchWorld(World):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(BATCH_AGENTS, auto_pump=False, capacity=BATCH_CAP)
        for agent, n in (("A", 3), ("B", 2), ("S", 2)):
            for _ in range(n):
                self.c.add_instance(agent)
        assert self.c.apply([Route("A", "A#0", "s0")], 0.0)[0].ok

    def do(self, name: str, a: int, b: int, k: int) -> None:
        super().do(name, a, b, k)
        held = [BATCH_AGENTS[c.agent_type].resources["memory_mb"]
                for cs in self.c.by_type.values() for c in cs
                if c.state_ in (InstanceState.ACTIVE, InstanceState.STARTING)]
        assert self.c.reserved.get("memory_mb", 0) == sum(held) <= BATCH_CAP["memory_mb"]
        for cs in self.c.by_type.values():
            for c in cs:
                assert len(c.running) <= c.slots


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=10, max_size=250), st.integers(0, 2**32))
def test_batching_never_runs_a_call_twice_or_loses_one(ops: list[Any], seed: int) -> None:
    w = BatchWorld()
    for name, a, b, k in ops:
        w.do(name, a, b, k)
    w.drain(random.Random(seed))
    w.check()
    w.check_forgotten()


def test_batches_and_refusals_actually_happen_in_random_schedules() -> None:
    """Not vacuous: instances do run several calls at once, and provisions are refused."""
    most_at_once = refused = 0
    for seed in range(40):
        rng = random.Random(seed)
        w = BatchWorld()
        for _ in range(200):
            w.do(rng.choice(("create", "deliver", "deliver", "start", "provision", "kill",
                             "finish")),
                 rng.randrange(1000), rng.randrange(1000), rng.randrange(1000))
            most_at_once = max([most_at_once, *(len(c.running) for c in
                                                w.c.controllers.values())])
        refused += sum(e["event"] == "control.applied" and not e["ok"]
                       and "memory_mb" in e["detail"] for e in w.c.take_events())
        w.drain(rng)
        w.check()
    assert most_at_once == 3 and refused > 0
