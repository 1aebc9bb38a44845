"""The primitives of NALAR Table 2 installed on local controllers: route (session and
weighted), set_priority (session and per agent), migrate, kill, provision; validation;
stateful agents keeping a session on one instance; the layer staying pure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scheduling.agents.cluster import FOLD_AT, Cluster
from scheduling.agents.policies import make_control_policy
from scheduling.agents.policy import (
    DRIVER,
    ControlView,
    Directives,
    FutureStatus,
    GlobalController,
    InstanceState,
    InstanceView,
    Kill,
    Migrate,
    Provision,
    Route,
    SetPriority,
    WeightedRoute,
    route,
    set_priority,
)

AGENTS = {"W": Directives(max_instances=4), "S": Directives(stateful=True, max_instances=3)}


def cluster(w: int = 2, s: int = 2, **kw: object) -> Cluster:
    c = Cluster(AGENTS, **kw)  # type: ignore[arg-type]
    for agent, n in (("W", w), ("S", s)):
        for _ in range(n):
            c.add_instance(agent)
    return c


# Read through functions: a type checker narrows an attribute after `assert ... is X` and
# would call the next check after an event (`... is Y`) impossible.
def status_of(c: Cluster, instance: str, future_id: str) -> FutureStatus:
    return c.controllers[instance].held[future_id].view.status


def state_of(c: Cluster, instance: str) -> InstanceState:
    return c.controllers[instance].state_


def run_all(c: Cluster, now: float = 1.0) -> list[str]:
    """Run every startable call to completion; returns call ids in start order."""
    order = []
    while ready := c.startable():
        for inst in ready:
            started = c.start_next(inst, now)
            if started is not None:
                order.append(started.future.future_id)
                c.finish(inst, started.future.future_id, "ok", True, now)
    return order


def test_least_loaded_placement_then_session_route() -> None:
    c = cluster()
    placed = [c.create(f"f{i}", "s", "W", 0.0) for i in range(4)]
    assert placed == ["W#0", "W#1", "W#0", "W#1"]
    [applied] = c.apply([route("W", "W#1", session="s")], 0.0)
    assert applied.ok
    assert [c.create(f"g{i}", "s", "W", 0.0) for i in range(3)] == ["W#1"] * 3
    assert c.create("h", "other", "W", 0.0) == "W#0"  # other sessions unaffected
    c.apply([Route("W", None, "s")], 0.0)
    assert c.rules.routes == {}


def test_weighted_route_follows_weights_and_skips_backlog() -> None:
    c = cluster(w=3)
    c.apply([route("W", ["W#0", "W#1", "W#2"], weights=[3, 1, 0])], 0.0)
    picks = [c.create(f"f{i}", f"s{i}", "W", 0.0) for i in range(8)]
    assert picks.count("W#2") == 0
    assert picks.count("W#0") == 6 and picks.count("W#1") == 2


def test_set_priority_reorders_queued_calls() -> None:
    c = cluster(w=1)
    for i, session in enumerate(["a", "b", "c", "b"]):
        c.create(f"f{i}", session, "W", float(i))
    c.apply([set_priority("b", 5.0)], 0.0)
    assert run_all(c) == ["f1", "f3", "f0", "f2"]
    # per-agent priority wins over the session's
    for i, session in enumerate(["a", "b"]):
        c.create(f"g{i}", session, "W", 0.0)
    c.apply([SetPriority("a", 9.0, "W"), SetPriority("b", 1.0)], 0.0)
    assert run_all(c) == ["g0", "g1"]


def test_set_priority_finds_calls_where_migration_took_them() -> None:
    """Re-keying follows a call's forwarding pointers; a running call is left alone."""
    c = cluster(w=2)
    for i, session in enumerate(["a", "b", "a", "b"]):
        c.create(f"f{i}", session, "W", 0.0)  # f0, f2 on W#0; f1, f3 on W#1
    [ok] = c.apply([Migrate("b", "W#1", "W#0", "f1")], 0.0)
    assert ok.ok and "f1" in c.controllers["W#0"].held
    started = c.start_next("W#1", 0.0)
    assert started is not None and started.future.future_id == "f3"
    c.apply([set_priority("b", 2.0)], 0.0)
    order = []
    while (started := c.start_next("W#0", 1.0)) is not None:
        order.append(started.future.future_id)
        c.finish("W#0", order[-1], "v", True, 1.0)
    assert order == ["f1", "f0", "f2"]  # by creation order, f1 would be second
    assert c.start_next("W#1", 1.0) is None  # f3 still runs, and was not queued again
    assert [ctl._n_queued for ctl in (c.controllers["W#0"], c.controllers["W#1"])] == [0, 0]


def test_migrate_one_call_and_a_whole_session() -> None:
    c = cluster(w=2)
    c.apply([route("W", "W#0", session="s")], 0.0)
    for i in range(3):
        c.create(f"f{i}", "s", "W", 0.0)
    c.create("x", "free", "W", 0.0)  # placed on W#1
    c.create("y", "free", "W", 0.0)
    started = c.start_next("W#0", 0.0)
    assert started is not None and started.future.future_id == "f0"
    # one call of a routed session cannot leave its state behind
    [refused] = c.apply([Migrate("s", "W#0", "W#1", "f1")], 0.0)
    assert not refused.ok and "move it whole" in refused.detail
    [ok] = c.apply([Migrate("free", "W#1", "W#0", "y")], 0.0)
    assert ok.ok and c.controllers["W#0"].held["y"].view.hops == 1
    c.apply([Migrate("s", "W#0", "W#1")], 0.0)
    assert c.rules.routes[("s", "W")] == "W#1"
    moved = {e["id"] for e in c.take_events() if e["event"] == "future.migrated"}
    assert moved == {"y", "f1", "f2"}  # f0 runs on: a started call is never moved
    assert c.create("f3", "s", "W", 0.0) == "W#1"
    # the session's calls wait at W#1 until its state leaves W#0 (after f0 ends)
    w1 = c.controllers["W#1"]
    assert status_of(c, "W#1", "f1") is FutureStatus.WAITING
    c.controllers["W#0"].state[("s", "W")] = {"turns": 1}
    c.finish("W#0", "f0", "v", True, 1.0)
    assert w1.state[("s", "W")] == {"turns": 1}
    assert status_of(c, "W#1", "f1") is FutureStatus.QUEUED
    assert set(run_all(c)) == {"f1", "f2", "f3", "x", "y"}


def test_kill_drains_and_provision_adds() -> None:
    c = cluster(w=2)
    for i in range(4):
        c.create(f"f{i}", f"s{i}", "W", 0.0)
    c.start_next("W#0", 0.0)
    applied = c.apply([Kill("W#0"), Provision("W")], 0.0)
    assert all(a.ok for a in applied)
    assert state_of(c, "W#0") is InstanceState.DRAINING
    assert [i.id for i in c.alive("W")] == ["W#1", "W#2"]
    assert set(c.controllers["W#0"].held) == {"f0"}  # the queued one moved off
    c.finish("W#0", "f0", "v", True, 1.0)
    assert state_of(c, "W#0") is InstanceState.DEAD
    assert set(run_all(c)) == {"f1", "f2", "f3"}
    # never below min_instances (1), never above max_instances (4)
    assert [a.ok for a in c.apply([Kill("W#1"), Kill("W#2")], 0.0)] == [True, False]
    out = c.apply([Provision("W")] * 4, 0.0)
    assert [a.ok for a in out] == [True, True, True, False]
    assert "max_instances" in out[3].detail


def test_stateful_agent_keeps_a_session_on_one_instance_in_call_order() -> None:
    c = cluster(s=3)
    c.external("dep", "s", 0.0)
    first = c.create("a0", "s", "S", 0.0, deps=["dep"])  # waits for its dependency
    rest = [c.create(f"a{i}", "s", "S", 0.0) for i in range(1, 5)]
    assert set(rest) == {first}
    others = {c.create(f"b{i}", f"t{i}", "S", 0.0) for i in range(3)}
    assert others == {"S#1", "S#2"}  # other sessions avoid the busy instance
    assert run_all(c) == ["b0", "b1", "b2"]  # a1.. wait for a0's turn
    c.complete("dep", 1, True, 1.0)
    assert run_all(c) == ["a0", "a1", "a2", "a3", "a4"]
    refused = c.apply([Migrate("s", first, "S#2"), route("S", "S#2", session="s"),
                       Kill(first)], 1.0)
    assert [a.ok for a in refused] == [False, False, False]
    assert "stateful" in refused[0].detail and "stateful" in refused[1].detail


def test_validation_names_the_problem() -> None:
    inst = (InstanceView("W#0", "W"), InstanceView("W#1", "W", state=InstanceState.DEAD),
            InstanceView("S#0", "S"))
    view = ControlView((), inst, AGENTS)
    gc = GlobalController(make_control_policy("static"))
    checks = gc._checked([
        Route("W", "W#9", "s"), Route("W", "S#0", "s"), Route("W", "W#1", "s"),
        WeightedRoute("W", ("W#0",), (1.0, 2.0)), WeightedRoute("W", ("W#0",), (0.0,)),
        SetPriority("s", float("nan")), Migrate("s", "W#0", "W#0"), Kill("W#0"),
        Provision("nope"), Route("W", "W#0", "s")], view, 0.0)
    reasons = [r.reason for r in checks.rejected]
    assert len(checks.accepted) == 1 and len(reasons) == 9
    for needle, reason in zip(["unknown instance", "runs S", "dead", "one weight",
                               "not all zero", "finite", "same instance", "min_instances",
                               "unknown agent type"], reasons, strict=True):
        assert needle in reason


def test_global_controller_period_and_swap() -> None:
    gc = GlobalController(make_control_policy("srtf-stage"), period_s=0.5)
    assert gc.due(0.0)
    c = cluster(w=1)
    c.create("f0", "s", "W", 0.0)
    c.create("f1", "s", "W", 0.0, deps=["f0"])
    step = gc.step(c.view(), 0.0)
    assert step.policy == "srtf-stage" and step.accepted == (SetPriority("s", 1.0, None,
                                                                         "srtf: deepest stage"),)
    assert not gc.due(0.3) and gc.due(0.5)
    old = gc.swap(make_control_policy("lpt-retries"))
    assert old.name == "srtf-stage" and gc.step(c.view(), 0.6).policy == "lpt-retries"
    with pytest.raises(KeyError, match="unknown control policy"):
        make_control_policy("nope")


def test_view_carries_metadata_and_metrics() -> None:
    c = cluster(w=1)
    c.create("f0", "s", "W", 0.0, call_key="W.go('x')")
    c.create("f1", "s", "W", 1.0, deps=["f0"], creator=DRIVER, call_key="W.go('x')")
    c.start_next("W#0", 2.0)
    view = c.view()
    f0, f1 = sorted(view.futures)
    assert (f0.status, f1.status) == (FutureStatus.RUNNING, FutureStatus.WAITING)
    assert f1.dependencies == ("f0",) and f0.consumers == ("f1",)
    assert (f1.stage, f1.attempt) == (1, 1)
    [w0] = view.instances_of("W")
    assert (w0.running, w0.waiting, w0.queued, w0.load) == (1, 1, 0, 2)
    assert view.by_session()["s"] and view.futures_at("W#0")
    # the cluster's running per-session tally matches a recount from the futures
    assert view.sessions == ControlView(view.futures, (), {}).sessions
    assert view.sessions["s"].live == 2 and view.sessions["s"].max_attempt == 1
    c.finish("W#0", "f0", "v", True, 3.0)  # the first sample sets the mean
    assert c.view().instances_of("W")[0].mean_service_s == pytest.approx(1.0)


def test_session_tallies_are_right_after_a_long_backlog_and_forgotten_sessions() -> None:
    """Counts wait for the next view (folded early past FOLD_AT); a session forgotten
    and started again under the same id starts from nothing."""
    c = cluster(w=2)
    calls = FOLD_AT // 2 + 7  # one round counts each call in and out: past FOLD_AT

    def round_(tag: str, finish_every: int) -> None:
        for i in range(calls):
            c.create(f"{tag}{i}", f"s{i % 50}", "W", 0.0, stage=i % 3, call_key=f"k{i % 7}")
        k = 0
        while ready := c.startable():
            for inst in ready:
                started = c.start_next(inst, 0.0)
                k += 1
                if started is not None and k % finish_every == 0:
                    c.finish(inst, started.future.future_id, "v", True, 0.0)
            if k > calls:
                break

    round_("a", 1)  # every call ends: the sessions end and are forgotten, unviewed
    assert not c.controllers["W#0"].held and not c.controllers["W#1"].held
    for i in range(50):
        c.forget_session(f"s{i}")
    assert not c._tally and c._counted  # counts of forgotten sessions still wait
    round_("b", 3)
    view = c.view()
    assert not c._counted
    assert view.sessions == ControlView(view.futures, (), {}).sessions
    assert sum(s.live for s in view.sessions.values()) == len(view.futures) > 0


CONTROL_MODULES = sorted(Path(__file__).resolve().parents[2].glob("scheduling/control*.py")) + \
    sorted(Path(__file__).resolve().parents[2].glob("scheduling/agents/policies/*.py"))
FORBIDDEN = {"asyncio", "zmq", "sqlalchemy", "textual", "litestar", "time", "datetime",
             "random", "threading", "socket", "os", "daemon", "db", "tools", "console",
             "webui", "agentd"}


@pytest.mark.parametrize("path", CONTROL_MODULES, ids=lambda p: p.name)
def test_control_layer_is_pure(path: Path) -> None:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert not roots & FORBIDDEN
