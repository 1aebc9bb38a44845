"""The validator and a step's paired decisions: a reassignment (kill one instance of A,
provision one of B in the room it frees) must not over-commit when its kill is refused,
whether the validator refuses it or the host fails to apply it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.agents.cluster import Cluster
from scheduling.agents.policy import (
    ControlDecision,
    ControlPolicy,
    ControlView,
    Directives,
    GlobalController,
    InstanceView,
    Kill,
    Migrate,
    Provision,
    Route,
    Rules,
    Validator,
)

CAP = {"memory_mb": 1000.0}
AGENTS = {"A": Directives(min_instances=2, max_instances=3, resources={"memory_mb": 400}),
          "B": Directives(min_instances=0, max_instances=3, resources={"memory_mb": 400})}


def full_view(rules: Rules | None = None) -> ControlView:
    """Two A instances (its min_instances) reserve 800 of 1000: no room for a B."""
    inst = [InstanceView("A#0", "A"), InstanceView("A#1", "A")]
    return ControlView((), inst, AGENTS, rules, capacity={"": CAP})


def test_a_kill_refused_for_min_instances_frees_no_room() -> None:
    view = full_view()
    v = Validator(view)
    assert "min_instances" in (v.check(Kill("A#1")) or "")
    assert v._reserved("") == view.reserved("") == {"memory_mb": 800.0}
    why = v.check(Provision("B"))
    assert why is not None and "200 of the run's memory_mb=1000 is free" in why
    # with a lower floor the same pair is a reassignment: the kill's release is the room
    roomy = {**AGENTS, "A": Directives(min_instances=1, max_instances=3,
                                       resources={"memory_mb": 400})}
    v = Validator(ControlView((), view.instances, roomy, capacity={"": CAP}))
    assert v.check(Kill("A#1")) is None and v.check(Provision("B")) is None
    assert v._reserved("") == {"memory_mb": 800.0}


def test_a_kill_refused_for_a_pin_or_a_dead_target_frees_no_room() -> None:
    agents = {**AGENTS, "A": Directives(min_instances=1, max_instances=3,
                                        resources={"memory_mb": 400})}
    pinned = ControlView((), full_view().instances, agents,
                         Rules(pins={("s", "A"): "A#1"}), capacity={"": CAP})
    for first in (Kill("A#1"), Kill("A#9")):
        v = Validator(pinned)
        assert v.check(first) is not None
        assert v.check(Provision("B")) is not None
    # a second kill of one instance frees it once
    v = Validator(pinned)
    assert v.check(Kill("A#0")) is None and v.check(Kill("A#0")) is not None
    assert v.check(Provision("B")) is None and v.check(Provision("B")) is not None


def test_the_global_step_refuses_both_halves_of_a_reassignment_it_cannot_make() -> None:
    class Pair(ControlPolicy):
        name = "pair"

        def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
            return [Kill("A#1", "reassign"), Provision("B", None, "reassign")]

    step = GlobalController(Pair()).step(full_view(), 0.0)
    assert step.accepted == ()
    assert [type(r.decision) for r in step.rejected] == [Kill, Provision]


def test_a_kill_of_an_instance_a_session_route_leads_to_is_refused_as_the_cluster_does() -> None:
    agents = {"A": Directives(min_instances=1, max_instances=3)}
    inst = [InstanceView("A#0", "A"), InstanceView("A#1", "A")]
    routed = ControlView((), inst, agents, Rules(routes={("s", "A"): "A#1"}))
    why = Validator(routed).check(Kill("A#1"))
    assert why == "A#1 holds the state of session s: migrate it first"
    # dropping the route first, in the same step, frees it
    v = Validator(routed)
    assert v.check(Route("A", None, "s")) is None and v.check(Kill("A#1")) is None
    # a session moved in the same step is not: the cluster may refuse the move
    v = Validator(routed)
    assert v.check(Migrate("s", "A#1", "A#0")) is None
    assert "session s" in (v.check(Kill("A#1")) or "")
    # a route set this step holds the instance too
    v = Validator(ControlView((), inst, agents))
    assert v.check(Route("A", "A#0", "t")) is None
    assert "session t" in (v.check(Kill("A#0")) or "")


def test_a_kill_the_cluster_refuses_does_not_let_a_provision_pass_max_instances() -> None:
    c = Cluster({"A": Directives(min_instances=1, max_instances=2)})
    c.add_instance("A")
    c.add_instance("A")
    assert c.apply([Route("A", "A#1", "s")], 0.0)[0].ok
    done = c.apply([Kill("A#1"), Provision("A")], 1.0)
    assert [a.ok for a in done] == [False, False]
    assert "session s" in done[0].detail and "max_instances (2)" in done[1].detail
    assert sorted(x.id for x in c.alive("A")) == ["A#0", "A#1"]


def test_a_migration_the_cluster_refuses_frees_no_instance_for_the_step() -> None:
    c = Cluster({"A": Directives(min_instances=1, max_instances=2)}, auto_pump=False)
    c.add_instance("A")
    c.add_instance("A")
    c.apply([Route("A", "A#0", "s")], 0.0)
    assert c.apply([Migrate("s", "A#0", "A#1")], 1.0)[0].ok  # its state is on its way
    done = c.apply([Migrate("s", "A#1", "A#0"), Kill("A#1"), Provision("A")], 2.0)
    assert [a.ok for a in done] == [False, False, False]
    assert "still moving" in done[0].detail and "max_instances (2)" in done[2].detail
    assert sorted(x.id for x in c.alive("A")) == ["A#0", "A#1"]


KINDS = st.sampled_from(["kill", "provision", "route", "drop"])
STEP = st.lists(st.tuples(KINDS, st.sampled_from("AB"), st.integers(0, 3)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(n_a=st.integers(1, 3), n_b=st.integers(0, 2), cap=st.sampled_from([800.0, 1200.0, 2000.0]),
       pinned=st.booleans(), step=STEP)
def test_what_a_step_accepts_holds_on_its_own(n_a: int, n_b: int, cap: float, pinned: bool,
                                              step: list[tuple[str, str, int]]) -> None:
    """The accepted decisions, checked again without the refused ones, are all accepted
    (no refused decision made room for one of them) and leave every type within its
    min/max_instances and the pool within its capacity."""
    agents = {t: Directives(min_instances=1, max_instances=3, resources={"memory_mb": 400})
              for t in "AB"}
    inst = [InstanceView(f"A#{i}", "A") for i in range(n_a)] + \
        [InstanceView(f"B#{i}", "B") for i in range(n_b)]
    rules = Rules(pins={("p", "A"): "A#0"}) if pinned else Rules()
    view = ControlView((), inst, agents, rules, capacity={"": {"memory_mb": cap}})
    decisions: list[ControlDecision] = []
    for kind, t, i in step:
        if kind == "kill":
            decisions.append(Kill(f"{t}#{i}"))
        elif kind == "provision":
            decisions.append(Provision(t))
        else:
            decisions.append(Route(t, f"{t}#{i}" if kind == "route" else None, f"s{i}"))
    v = Validator(view)
    accepted = [d for d in decisions if v.check(d) is None]
    again = Validator(view)
    assert [again.check(d) for d in accepted] == [None] * len(accepted)
    for t, n in (("A", n_a), ("B", n_b)):
        killed = sum(isinstance(d, Kill) and d.instance_id.startswith(t) for d in accepted)
        added = sum(isinstance(d, Provision) and d.agent_type == t for d in accepted)
        assert killed == 0 or n - killed + added >= 1
        assert added == 0 or n - killed + added <= 3
    held = 400.0 * (n_a + n_b + sum(isinstance(d, Provision) for d in accepted)
                    - sum(isinstance(d, Kill) for d in accepted))
    assert sum(isinstance(d, Provision) for d in accepted) == 0 or held <= cap
