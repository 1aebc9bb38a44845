"""The load-imbalance benchmark's emulation (bench/runtime_sim.py and its two workloads)
on a few minutes of trace: every request completes, nothing beats the no-queueing
floor, sessions are reconstructed from the trace's shared prefixes, and a reassigned
instance's replacement starts loading only once the killed one has drained (nothing
runs beyond the setup's instances)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from bench import runtime_analyst, runtime_router
from bench.runtime_sim import PROVISION_S, Setup, service_s
from daemon.engines.sim.cost import load_cost_model
from scheduling.agents.policies import StaticRouting, nalar_default
from scheduling.agents.policy import ControlDecision, ControlPolicy, ControlView, Kill, Provision

COST = load_cost_model("llama3-8b-h100")
SHORT = (1200.0, 1320.0)  # two minutes


def test_follow_up_turns_continue_an_earlier_session() -> None:
    turns = runtime_analyst.turns(1.0, SHORT)
    seen: set[str] = set()
    follow = 0
    for t in sorted(turns, key=lambda t: t.arrival):
        assert (t.shared > 0) == (t.session in seen)
        follow += t.session in seen
        seen.add(t.session)
        assert t.shared <= t.context
    assert follow > 0 and len(seen) < len(turns)


class _Recording(runtime_analyst.AnalystSim):
    """Notes where each session's Analyst calls ran."""

    def __init__(self, policy: ControlPolicy) -> None:
        super().__init__(policy, COST)
        self.ran: dict[str, set[str]] = {}

    def duration(self, fid: str, instance: str) -> float:
        if fid in self.calls:
            session = self.turns[int(fid.split(".")[0])].session
            self.ran.setdefault(session, set()).add(instance)
        return super().duration(fid, instance)


def test_analyst_turns_all_complete_and_never_beat_the_floor() -> None:
    turns = runtime_analyst.turns(1.2, SHORT)
    by_rid = {t.rid: t for t in turns}
    moved = {}
    for name, policy in (("static", StaticRouting()), ("nalar", nalar_default())):
        sim = _Recording(policy)
        sim.run(((t.arrival, t) for t in turns), len(turns))
        assert len(sim.latency) == len(turns)
        for rid, latency in sim.latency.items():
            assert latency >= runtime_analyst.floor_s(by_rid[rid], COST) - 1e-9
        moved[name] = sum(len(where) > 1 for where in sim.ran.values())
    # static: every session stays on the instance its state is on; nalar moves some
    assert moved["static"] == 0 < moved["nalar"]


def test_free_moves_reference_hits_the_cache_wherever_a_session_runs() -> None:
    """The reference prices no recompute: its sessions spread over instances (no
    sticky route), yet every turn still meets the floor, and it never beats it."""
    turns = runtime_analyst.turns(1.2, SHORT)
    by_rid = {t.rid: t for t in turns}
    sim = runtime_analyst.AnalystSim(StaticRouting(), COST, free_moves=True)
    sim.run(((t.arrival, t) for t in turns), len(turns))
    assert len(sim.latency) == len(turns) and not sim.c.rules.routes
    for rid, latency in sim.latency.items():
        assert latency >= runtime_analyst.floor_s(by_rid[rid], COST) - 1e-9
    t = next(t for t in turns if t.shared)
    charged, rebuilt = {}, {}
    for free in (False, True):  # the session's cache is on Analyst#0; the call runs on #1
        probe = runtime_analyst.AnalystSim(StaticRouting(), COST, free_moves=free)
        probe.turns[t.rid] = t
        probe.calls[f"{t.rid}.plan"] = (t.context, 1, t.shared)
        probe.kv[t.session] = ("Analyst#0", t.context)
        charged[free] = probe.duration(f"{t.rid}.plan", "Analyst#1")
        rebuilt[free] = probe.rebuilt_s
    assert charged[True] < charged[False]  # no recompute
    # what the bench reports as the price of moving: exactly the prefill paid again
    assert rebuilt[True] == 0.0
    assert rebuilt[False] == pytest.approx(charged[False] - charged[True]) and rebuilt[False] > 0


def test_analyst_prices_a_sessions_state_as_its_recompute() -> None:
    """What a move would cost the session: the prefill of all it has cached, without
    a cache; nothing with free moves."""
    t = next(t for t in runtime_analyst.turns(1.2, SHORT) if t.shared)
    seen = {}
    for free in (False, True):
        probe = runtime_analyst.AnalystSim(StaticRouting(), COST, free_moves=free)
        probe.turns[t.rid] = t
        probe.calls[f"{t.rid}.plan"] = (t.context, 7, t.shared)
        probe.duration(f"{t.rid}.plan", "Analyst#1")
        probe.c.create("probe", t.session, runtime_analyst.ANALYST, 0.0)
        seen[free] = probe.c.view(0.0).sessions[t.session].state_s
    assert seen[True] == 0.0
    assert seen[False] == pytest.approx(service_s(COST, t.context + 7, 0)) and seen[False] > 0


class _KillThenProvision(ControlPolicy):
    """At its first step: take one Chat instance and give it to Coding."""

    name: ClassVar[str] = "kill-then-provision"

    def __init__(self) -> None:
        self.done = False

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        if self.done:
            return []
        self.done = True
        busy = max(view.instances_of("Chat"), key=lambda i: i.load)
        return [Kill(busy.instance_id, "test"), Provision("Coding", None, "test")]


def test_replacement_loads_only_after_the_killed_instance_drained() -> None:
    reqs = runtime_router.requests(1.0, SHORT)
    sim = runtime_router.RouterSim(_KillThenProvision(), COST)
    dead_at: dict[str, float] = {}
    active_at: dict[str, float] = {}
    real_activate = sim.c.activate

    def activate(instance_id: str, now: float | None = None) -> None:
        active_at[instance_id] = sim.now
        real_activate(instance_id, now)

    sim.c.activate = activate  # type: ignore[method-assign]
    real_event = sim.c._event

    def event(kind: str, **data: object) -> None:
        if kind == "instance.dead":
            dead_at[str(data["instance"])] = sim.now
        real_event(kind, **data)

    sim.c._event = event  # type: ignore[method-assign]
    sim.run(((r.arrival, r) for r in reqs), len(reqs))
    assert len(sim.latency) == len(reqs)
    [killed] = dead_at
    [new] = active_at
    assert new.startswith("Coding#")
    assert active_at[new] >= dead_at[killed] + PROVISION_S - 1e-9


class _ProvisionThenKill(ControlPolicy):
    """Provisions a Coding instance over the budget at once; kills a Chat one at 30 s."""

    name: ClassVar[str] = "provision-then-kill"

    def __init__(self) -> None:
        self.step = 0

    def decide(self, view: ControlView, now: float) -> list[ControlDecision]:
        self.step += 1
        if self.step == 1:
            return [Provision("Coding", None, "test")]
        if now >= 30.0 and len(view.instances_of("Chat")) == 10:
            return [Kill(min(view.instances_of("Chat"), key=lambda i: i.load).instance_id)]
        return []


def test_an_instance_over_the_budget_waits_for_resources() -> None:
    reqs = runtime_router.requests(1.0, SHORT)
    sim = runtime_router.RouterSim(_ProvisionThenKill(), COST)
    active_at: dict[str, float] = {}
    dead_at: list[float] = []
    real_activate, real_event = sim.c.activate, sim.c._event

    def activate(instance_id: str, now: float | None = None) -> None:
        active_at[instance_id] = sim.now
        real_activate(instance_id, now)

    def event(kind: str, **data: object) -> None:
        if kind == "instance.dead":
            dead_at.append(sim.now)
        real_event(kind, **data)

    sim.c.activate = activate  # type: ignore[method-assign]
    sim.c._event = event  # type: ignore[method-assign]
    sim.run(((r.arrival, r) for r in reqs), len(reqs))
    assert len(sim.latency) == len(reqs)
    [new] = active_at
    [died] = dead_at
    assert died >= 30.0 and active_at[new] >= died + PROVISION_S - 1e-9


def test_clairvoyant_reference_moves_instances_and_completes() -> None:
    reqs = runtime_router.requests(1.2, SHORT)
    setup = Setup(runtime_router.ALLOCATION)  # floors of one instance each
    ahead = runtime_router.Clairvoyant(reqs, COST, setup)
    row = runtime_router.simulate(ahead, "clairvoyant", reqs, COST, setup=setup)
    assert row["requests"] == len(reqs) and row["instances_provisioned"] > 0


def test_router_on_one_shared_pool_completes() -> None:
    reqs = runtime_router.requests(1.2, SHORT)
    row = runtime_router.simulate(StaticRouting(), "pool", reqs, COST, pooled=True)
    assert row["requests"] == len(reqs) and row["p99_s"] >= row["p50_s"] > 0
