"""The default control policies, on views built by real local controllers."""

from __future__ import annotations

import inspect

import pytest

from scheduling.agents.cluster import Cluster
from scheduling.agents.policies import (
    CONTROL_POLICIES,
    HeadOfLineMigration,
    LoadBalanced,
    LptRetries,
    ResourceReassignment,
    SrtfByStage,
    make_control_policy,
    sample_view,
)
from scheduling.agents.policy import (
    ControlView,
    Directives,
    GlobalController,
    InstanceView,
    Kill,
    Migrate,
    Provision,
    Route,
    SetPriority,
    WeightedRoute,
)


def test_srtf_by_stage_prioritises_deeper_sessions_and_only_emits_changes() -> None:
    c = Cluster({"W": Directives(max_instances=2)})
    c.add_instance("W")
    c.create("a0", "a", "W", 0.0)
    c.create("b0", "b", "W", 0.0)
    c.create("b1", "b", "W", 0.0, deps=["b0"])
    c.create("b2", "b", "W", 0.0, deps=["b1"])
    decisions = SrtfByStage().decide(c.view(), 0.0)
    assert {(d.session_id, d.value) for d in decisions if isinstance(d, SetPriority)} == {
        ("b", 2.0)}  # "a" is at stage 0 = the default priority: nothing to change
    c.apply(decisions, 0.0)
    assert SrtfByStage().decide(c.view(), 0.0) == []
    first = c.start_next("W#0", 0.0)
    assert first is not None and first.future.future_id == "b0"


def test_lpt_puts_retried_sessions_first() -> None:
    c = Cluster({"W": Directives()})
    c.add_instance("W")
    c.create("x0", "x", "W", 0.0, call_key="dev('t1')")
    c.create("y0", "y", "W", 0.0, call_key="dev('t1')")
    c.create("y1", "y", "W", 0.0, call_key="dev('t1')")  # y retries
    decisions = LptRetries().decide(c.view(), 0.0)
    assert decisions == [SetPriority("y", 1.0, None, "lpt: retried first")]


def test_load_balanced_ignores_each_instances_own_mean() -> None:
    """An instance's mean says which calls it ran, not how fast it is: equal loads,
    equal weights, whatever the means (a new one included)."""
    inst = (InstanceView("W#0", "W", completed=5, mean_service_s=0.1),
            InstanceView("W#1", "W", completed=5, mean_service_s=10.0),
            InstanceView("W#2", "W"))
    view = ControlView((), inst, {"W": Directives(max_instances=3)})
    [d] = LoadBalanced().decide(view, 0.0)
    assert isinstance(d, WeightedRoute)
    assert d.instances == ("W#0", "W#1", "W#2") and d.weights == (1.0, 1.0, 1.0)


def _three_running(now: float, ran: tuple[float, float, float]) -> Cluster:
    """W#0..2, W#0 timed at 0.1 s a call and the others at 10 s (the type's mean is
    ~6.7 s); each runs one call, started `ran` seconds before `now`."""
    c = Cluster({"W": Directives(max_instances=3)})
    for _ in range(3):
        c.add_instance("W")
    for inst, service in (("W#0", 0.1), ("W#1", 10.0), ("W#2", 10.0)):
        _timed(c, inst, service, 1.0 + service)
    for k, r in enumerate(ran):
        inst = f"W#{k}"
        c.apply([Route("W", inst, f"busy{k}")], now)
        c.create(f"busy{k}", f"busy{k}", "W", now - r)
        c.start_next(inst, now - r)
        c.apply([Route("W", None, f"busy{k}")], now)
    return c


def _place_sessions(c: Cluster, n: int, now: float) -> dict[str, int]:
    c.apply(LoadBalanced().decide(c.view(now), now), now)
    placed: dict[str, int] = {}
    for k in range(n):
        inst = c.create(f"new{k}", f"new{k}", "W", now)
        placed[inst] = placed.get(inst, 0) + 1
    return placed


def test_load_balanced_spreads_a_burst_of_new_sessions() -> None:
    """The weights of an instance that just ran short calls used to be ten times the
    others', and a step's new sessions piled onto it: now they spread."""
    c = _three_running(30.0, (0.0, 0.0, 0.0))
    assert _place_sessions(c, 9, 30.0) == {"W#0": 3, "W#1": 3, "W#2": 3}


def test_load_balanced_counts_an_overrunning_call_as_more_work() -> None:
    """W#0's call has run three times the type's mean: expected to run as long again,
    so new calls go to the others first."""
    c = _three_running(50.0, (20.0, 0.0, 0.0))
    [d] = LoadBalanced().decide(c.view(50.0), 50.0)
    assert isinstance(d, WeightedRoute)
    weights = dict(zip(d.instances, d.weights, strict=True))
    assert weights["W#0"] < weights["W#1"] == weights["W#2"] == 1.0
    placed = _place_sessions(c, 6, 50.0)
    assert placed.get("W#0", 0) < min(placed["W#1"], placed["W#2"])


def test_load_balanced_lists_the_least_utilised_first() -> None:
    """Placement takes the first of equal costs: the idle instance that has been busy
    least lately, not always the first one (where sticky sessions would gather)."""
    inst = (InstanceView("W#0", "W", utilisation=0.9),
            InstanceView("W#1", "W", utilisation=0.1),
            InstanceView("W#2", "W", utilisation=0.5))
    view = ControlView((), inst, {"W": Directives(max_instances=3)})
    [d] = LoadBalanced().decide(view, 0.0)
    assert isinstance(d, WeightedRoute)
    assert d.instances == ("W#1", "W#2", "W#0")
    assert d.weights[0] == 1.0 > d.weights[1] > d.weights[2]


def test_head_of_line_migration_moves_the_head_to_an_idle_instance() -> None:
    c = Cluster({"W": Directives(max_instances=2)})
    c.add_instance("W")
    c.add_instance("W")
    c.apply([WeightedRoute("W", ("W#0",), (1.0,))], 0.0)  # everything lands on W#0
    for i, s in enumerate(["a", "b", "c"]):
        c.create(f"f{i}", s, "W", float(i))
    c.apply([SetPriority("c", 3.0)], 0.0)
    c.start_next("W#0", 1.0)  # f2 (priority) runs; f0, f1 wait behind it; f1 would wait longest
    decisions = HeadOfLineMigration().decide(c.view(), 2.0)
    assert decisions == [Migrate("b", "W#0", "W#1", "f1", "head-of-line: W#1 is idle")]
    c.apply(decisions, 2.0)
    started = c.start_next("W#1", 2.0)
    assert started is not None and started.future.future_id == "f1"
    assert HeadOfLineMigration().decide(c.view(), 3.0) == []  # nobody idle any more


def _timed(c: Cluster, instance: str, service_s: float, now: float) -> None:
    """One call of `service_s` ran and ended on `instance` at `now`: the mean it reports."""
    fid = f"timed-{instance}-{now}"
    c.apply([Route("W", instance, fid)], now)
    c.create(fid, fid, "W", now - service_s)
    started = c.start_next(instance, now - service_s)
    assert started is not None and started.future.future_id == fid
    c.finish(instance, fid, None, True, now)
    c.apply([Route("W", None, fid)], now)


def _sticky_cluster() -> Cluster:
    """W#0 runs session "long"'s call since t=10; session "s" keeps its state on W#0
    (a route) and has a call queued there; W#1 is idle. W's calls take 2 s."""
    c = Cluster({"W": Directives(max_instances=2)})
    c.add_instance("W")
    c.add_instance("W")
    for inst in ("W#0", "W#1"):
        _timed(c, inst, 2.0, 5.0)
    c.apply([Route("W", "W#0", "long"), Route("W", "W#0", "s")], 10.0)
    c.create("l0", "long", "W", 10.0)
    c.start_next("W#0", 10.0)
    c.create("s0", "s", "W", 10.5)
    return c


def test_head_of_line_migration_keeps_a_stateful_session_for_a_short_wait() -> None:
    """Moving a session rebuilds its state at the destination: not worth it to skip
    less than one mean service time of waiting."""
    c = _sticky_cluster()
    assert HeadOfLineMigration().decide(c.view(11.5), 11.5) == []  # ~0.5 s left


def test_head_of_line_migration_expects_an_overrunning_call_to_run_on() -> None:
    """A call that has run past the mean is expected to run about as long again: the
    session behind it moves, state and all."""
    c = _sticky_cluster()
    decisions = HeadOfLineMigration().decide(c.view(14.0), 14.0)  # l0 has run 4 s
    assert decisions == [Migrate("s", "W#0", "W#1", None, "head-of-line: W#1 is idle")]
    c.apply(decisions, 14.0)
    started = c.start_next("W#1", 14.0)
    assert started is not None and started.future.future_id == "s0"
    assert c.rules.routes[("s", "W")] == "W#1"  # its state went with it


def test_head_of_line_migration_weighs_the_wait_against_the_sessions_state_cost() -> None:
    """The same ~4 s wait (W#1 idle) moves session "s" whose state rebuilds in 3 s,
    and not one whose state takes 10 s to rebuild."""
    for state_s, moves in ((3.0, True), (10.0, False)):
        c = _sticky_cluster()
        c.set_state_cost("s", state_s)
        view = c.view(14.0)
        assert view.sessions["s"].state_s == state_s
        decisions = HeadOfLineMigration().decide(view, 14.0)
        assert decisions == ([Migrate("s", "W#0", "W#1", None, "head-of-line: W#1 is idle")]
                             if moves else [])


def test_head_of_line_migration_prices_the_state_of_a_session_without_a_route() -> None:
    """A call whose session has no route moves for any wait, unless its host prices
    a state it would rebuild: then only for a longer wait than that."""
    c = _sticky_cluster()
    c.apply([WeightedRoute("W", ("W#0",), (1.0,))], 10.5)
    c.create("u0", "u", "W", 10.6)  # behind s0: expected wait ~6 s at t=14
    c.set_state_cost("s", 100.0)
    c.set_state_cost("u", 8.0)
    assert HeadOfLineMigration().decide(c.view(14.0), 14.0) == []
    c.set_state_cost("u", 5.0)
    assert HeadOfLineMigration().decide(c.view(14.0), 14.0) == [
        Migrate("u", "W#0", "W#1", "u0", "head-of-line: W#1 is idle")]


def test_head_of_line_migration_moves_a_free_call_past_a_session_worth_keeping() -> None:
    """The session due next is not worth its state's rebuild; the call queued behind
    it, with no state anywhere, moves instead."""
    c = _sticky_cluster()
    c.apply([SetPriority("s", 1.0), WeightedRoute("W", ("W#0",), (1.0,))], 10.5)
    c.create("u0", "u", "W", 10.6)
    decisions = HeadOfLineMigration().decide(c.view(11.5), 11.5)
    assert decisions == [Migrate("u", "W#0", "W#1", "u0", "head-of-line: W#1 is idle")]


def _used(view: ControlView, **utilisation: float) -> ControlView:
    """The same view with the named instances' utilisation (last ~30 s) set: how busy a
    pool has been is the controllers' decayed average, which a test states outright."""
    def busy(i: InstanceView) -> InstanceView:
        key = i.instance_id.replace("#", "_")
        return i._replace(utilisation=utilisation[key]) if key in utilisation else i

    return ControlView(view.futures, [busy(i) for i in view.instances], view.agents,
                       view.rules, view.sessions.values())


def test_head_of_line_migration_pays_a_rebuild_only_from_the_pools_slack() -> None:
    """Session "s" waits ~4 s behind W#0, its state rebuilds in 3 s, W#1 is idle now.
    A pool busy 97% of the last ~30 s has ~1.8 s of idle time to pay the rebuild from:
    W#1's gap is its own sessions' and the session stays. Half idle, it moves."""
    c = _sticky_cluster()
    c.set_state_cost("s", 3.0)
    move = [Migrate("s", "W#0", "W#1", None, "head-of-line: W#1 is idle")]
    saturated = _used(c.view(14.0), W_0=1.0, W_1=0.94)
    assert HeadOfLineMigration().decide(saturated, 14.0) == []
    assert HeadOfLineMigration().decide(_used(c.view(14.0), W_0=1.0, W_1=0.5), 14.0) == move
    c.set_state_cost("s", 0.0)  # a move that rebuilds nothing needs no slack
    assert HeadOfLineMigration().decide(_used(c.view(14.0), W_0=1.0, W_1=0.94), 14.0) == move


def test_head_of_line_migration_spends_the_slack_once_per_step() -> None:
    """Two sessions, each 3 s of state to rebuild, two idle instances, 4.5 s of slack:
    one moves (the one whose queue has waited longest), not both."""
    c = Cluster({"W": Directives(max_instances=4)})
    for _ in range(4):
        c.add_instance("W")
    for inst in ("W#0", "W#1", "W#2", "W#3"):
        _timed(c, inst, 2.0, 5.0)
    for src, s, at in (("W#0", "a", 10.0), ("W#1", "b", 10.2)):
        c.apply([Route("W", src, f"long-{s}"), Route("W", src, s)], at)
        c.create(f"l-{s}", f"long-{s}", "W", at)
        c.start_next(src, at)
        c.create(f"{s}0", s, "W", at + 0.5)
        c.set_state_cost(s, 3.0)
    view = _used(c.view(14.0), W_0=1.0, W_1=1.0, W_2=0.9, W_3=0.95)  # 0.15 x 30 s
    assert HeadOfLineMigration().decide(view, 14.0) == [
        Migrate("a", "W#0", "W#2", None, "head-of-line: W#2 is idle")]
    roomy = _used(c.view(14.0), W_0=1.0, W_1=1.0, W_2=0.5, W_3=0.5)
    assert len(HeadOfLineMigration().decide(roomy, 14.0)) == 2


def _backlog(c: Cluster, agent: str, n: int, service_s: float, now: float) -> None:
    """`n` calls of `agent` queued, after one of that agent's calls took `service_s`."""
    inst = c.alive(agent)[0].id
    c.create(f"{agent}@{now}", f"{agent}-t", agent, now - service_s - 1)
    started = c.start_next(inst, now - service_s)
    assert started is not None
    c.finish(inst, started.future.future_id, None, True, now)
    for i in range(n):
        c.create(f"{agent}@{now}.{i}", f"{agent}-s{i}", agent, now)


def test_reassignment_levels_the_work_per_instance() -> None:
    agents = {"chat": Directives(min_instances=1, max_instances=4),
              "code": Directives(min_instances=1, max_instances=4)}
    c = Cluster(agents)
    for agent in ("chat", "chat", "code"):
        c.add_instance(agent, now=0.0)
    _backlog(c, "code", 12, 2.0, 1.0)  # 24 s of work on one instance
    policy = ResourceReassignment(budget=3, min_gain_s=5.0)
    # chat's instances are new: they count as fully used, so chat has nothing to spare
    assert policy.decide(c.view(1.0), 1.0) == []
    decisions = policy.decide(c.view(90.0), 90.0)  # chat idle for a minute and a half
    assert [type(d) for d in decisions] == [Kill, Provision]
    assert isinstance(decisions[0], Kill) and decisions[0].instance_id.startswith("chat#")
    assert decisions[1] == Provision("code", None, "24.0 s of work per instance")
    c.apply(decisions, 90.0)
    assert len(c.alive("chat")) == 1 and len(c.alive("code")) == 2
    # chat is at its min now: nothing more to take; unbounded, code just grows
    assert policy.decide(c.view(90.0), 90.0) == []
    unbounded = ResourceReassignment(min_gain_s=5.0).decide(c.view(90.0), 90.0)
    assert [type(d) for d in unbounded] == [Provision]


def test_reassignment_counts_a_draining_instance_against_the_budget() -> None:
    """A killed instance holds its resources until its running call ends: provisioning
    into that room would run one instance more than the budget."""
    agents = {"chat": Directives(min_instances=1, max_instances=4),
              "code": Directives(min_instances=1, max_instances=4)}
    c = Cluster(agents)
    for agent in ("chat", "chat", "code"):
        c.add_instance(agent, now=0.0)
    c.create("long", "s-long", "chat", 0.0)
    c.start_next("chat#0", 0.0)
    c.apply([Kill("chat#0", "test")], 1.0)  # drains: its call still runs
    _backlog(c, "code", 12, 2.0, 2.0)
    policy = ResourceReassignment(budget=3, min_gain_s=5.0)
    assert len(c.view(2.0).provisioned("chat")) + len(c.view(2.0).provisioned("code")) == 2
    assert policy.decide(c.view(2.0), 2.0) == []  # chat is at its min; no room to add
    c.finish("chat#0", "long", None, True, 3.0)  # dead now: its room is free
    assert policy.decide(c.view(3.0), 3.0) == [
        Provision("code", None, "24.0 s of work per instance")]


def test_reassignment_takes_only_serving_instances_above_the_floor() -> None:
    """A donor at its floor of serving instances, a third still starting: the validator
    would refuse the kill and let the provision through alone, over the budget."""
    agents = {"chat": Directives(min_instances=2, max_instances=4),
              "code": Directives(min_instances=1, max_instances=4)}
    c = Cluster(agents, cold_start=True)
    c.add_instance("chat", now=0.0)
    c.add_instance("chat", now=0.0)
    c.add_instance("chat", now=0.0, starting=True)
    c.add_instance("code", now=0.0)
    _backlog(c, "code", 12, 2.0, 90.0)  # chat idle long enough to have capacity to spare
    policy = ResourceReassignment(budget=4, min_gain_s=5.0)
    assert policy.decide(c.view(90.0), 90.0) == []
    c.activate("chat#2")
    step = GlobalController(policy).step(c.view(90.0), 90.0)
    assert [type(d) for d in step.accepted] == [Kill, Provision] and not step.rejected


def test_reassignment_needs_a_clear_difference_and_spares_state() -> None:
    agents = {"chat": Directives(min_instances=1, max_instances=4),
              "code": Directives(min_instances=1, max_instances=4)}
    c = Cluster(agents)
    for agent in ("chat", "chat", "code"):
        c.add_instance(agent, now=0.0)
    _backlog(c, "code", 4, 2.0, 1.0)  # 8 s on one instance, 4 s each with a second
    policy = ResourceReassignment(budget=3, min_gain_s=5.0)
    assert policy.decide(c.view(90.0), 90.0) == []  # a move would not gain a cold start
    _backlog(c, "code", 20, 2.0, 91.0)
    # both chat instances hold a session's state (routes): neither is for taking
    c.apply([Route("chat", "chat#0", "x"), Route("chat", "chat#1", "y")], 91.0)
    assert policy.decide(c.view(91.0), 91.0) == []
    c.apply([Route("chat", None, "y")], 91.0)
    decisions = policy.decide(c.view(91.0), 91.0)
    assert decisions and decisions[0] == Kill("chat#1", "reassigned to code")


def _fan_out(receiver_keeps_state: bool) -> Cluster:
    """An analyst-like pair: "lead" (1 instance, 24 s of work queued) and "sub" (3 idle
    instances); a budget of 4 leaves a kill-and-provision as the only move."""
    agents = {"lead": Directives(min_instances=1, max_instances=4),
              "sub": Directives(min_instances=1, max_instances=4)}
    c = Cluster(agents)
    for agent in ("lead", "sub", "sub", "sub"):
        c.add_instance(agent, now=0.0)
    if receiver_keeps_state:
        c.apply([Route("lead", "lead#0", "conversation")], 0.0)
    _backlog(c, "lead", 12, 2.0, 1.0)
    return c


def test_reassignment_gives_for_good_only_what_the_donor_can_spare_after() -> None:
    """Every lead instance holds a session's state: an instance moved there never comes
    back. sub used 2 of its 3 instances: losing one would leave it at 100% for good,
    and it keeps it; at 1 of 3 it still has an instance unused after the move and
    gives. Were a lead instance stateless (the move reversible), 2 of 3 is enough."""
    policy = ResourceReassignment(budget=4, min_gain_s=5.0)
    kinds = [Kill, Provision]
    for keeps, used, gives in ((True, 2 / 3, False), (True, 1 / 3, True),
                               (False, 2 / 3, True), (False, 0.8, False)):
        view = _used(_fan_out(keeps).view(1.0), sub_0=used, sub_1=used, sub_2=used)
        decisions = policy.decide(view, 1.0)
        assert [type(d) for d in decisions] == (kinds if gives else []), (keeps, used)
        if gives:
            assert decisions[1] == Provision("lead", None, "24.0 s of work per instance")


def _both_queue(chat_queued_at: float) -> Cluster:
    """chat: 2 instances, both busy, 2 calls queued since `chat_queued_at` (4 s of work
    per instance); code: 1 instance, 60 s queued. A budget of 3: only a loan helps."""
    agents = {"chat": Directives(min_instances=1, max_instances=4),
              "code": Directives(min_instances=1, max_instances=4)}
    c = Cluster(agents)
    for agent in ("chat", "chat", "code"):
        c.add_instance(agent, now=0.0)
    _backlog(c, "chat", 0, 2.0, 3.0)
    for i in range(2):
        c.create(f"run{i}", f"r{i}", "chat", 10.0)
    for inst in c.alive("chat"):
        assert c.start_next(inst.id, 10.0) is not None
    for i in range(2):
        c.create(f"q{i}", f"q{i}", "chat", chat_queued_at)
    _backlog(c, "code", 30, 2.0, 60.0)
    return c


def test_reassignment_lends_from_a_busy_donor_whose_queue_is_not_growing() -> None:
    """Both agents queue; chat has no instance to spare (the spare test refuses), but
    its backlog is older than it is long (served faster than it came) and an instance
    down it waits 8 s against code's 30 s with the instance: a loan that comes back.
    The same backlog built in the last half second, or a loan for good, is refused."""
    policy = ResourceReassignment(budget=3, min_gain_s=5.0)
    busy = {"chat_0": 1.0, "chat_1": 1.0}
    decisions = policy.decide(_used(_both_queue(10.0).view(60.0), **busy), 60.0)
    assert [type(d) for d in decisions] == [Kill, Provision]
    assert isinstance(decisions[0], Kill) and decisions[0].instance_id.startswith("chat#")
    assert policy.decide(_used(_both_queue(59.5).view(60.0), **busy), 60.0) == []
    for_good = _both_queue(10.0)
    for_good.apply([Route("code", "code#0", "conversation")], 60.0)
    assert policy.decide(_used(for_good.view(60.0), **busy), 60.0) == []
    # code with the instance would wait 30 s, chat without it 8 s: a ratio of 4 refuses
    strict = ResourceReassignment(budget=3, min_gain_s=5.0, ratio=4.0)
    assert strict.decide(_used(_both_queue(10.0).view(60.0), **busy), 60.0) == []


def test_default_policy_runs_all_three_through_the_global_controller() -> None:
    c = Cluster({"W": Directives(max_instances=3)})
    c.add_instance("W")
    c.add_instance("W")
    c.apply([WeightedRoute("W", ("W#0",), (1.0,))], 0.0)
    for i in range(40):  # ~13 s of work per instance even with a third: worth a new one
        c.create(f"f{i}", f"s{i}", "W", 0.0)
    c.start_next("W#0", 0.0)
    step = GlobalController(make_control_policy("nalar-default")).step(c.view(), 1.0)
    kinds = sorted(type(d).__name__ for d in step.accepted)
    assert kinds == ["Migrate", "Provision", "WeightedRoute"] and not step.rejected


@pytest.mark.parametrize("cls", [SrtfByStage, LptRetries])
def test_example_policies_are_short(cls: type) -> None:
    """NALAR §6.2: such policies take about a dozen lines; ours stay within 15."""
    lines = [ln for ln in inspect.getsource(cls).splitlines() if ln.strip()]
    assert len(lines) <= 15


def test_every_builtin_is_constructible_and_named() -> None:
    for name, factory in CONTROL_POLICIES.items():
        assert factory().name == name


def test_every_builtin_decides_on_the_sample_view_with_valid_decisions() -> None:
    """What a dry run of the control layer does: each built-in, on the sample view,
    returns decisions the global controller accepts."""
    view = sample_view(100.0)
    assert {i.instance_id for i in view.instances} == {"Dev#0", "Dev#1", "Chat#0"}
    for name in CONTROL_POLICIES:
        step = GlobalController(make_control_policy(name)).step(view, 100.0)
        assert not step.rejected, (name, step.rejected)
