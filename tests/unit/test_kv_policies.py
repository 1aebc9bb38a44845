"""Baselines, the agentd additions, operator migration and the registry."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.kv import (
    KV_POLICIES,
    Admit,
    AgentdOptions,
    AgentdPolicy,
    ContinuumTtlPolicy,
    KvConfig,
    KvView,
    MarkPauseAfterRequest,
    Pause,
    ProgramView,
    Restore,
    StickyPolicy,
    ThunderAgentPolicy,
    VllmDefaultPolicy,
    WorkerView,
    make_kv_policy,
    plan_migration,
)
from tests.kv_programs import NOW, A, P, Q, R, prog


def view(*programs: ProgramView, used: tuple[int, ...] = (0, 0), cap: int = 1000,
         **cfg: Any) -> KvView:
    workers = tuple(WorkerView(f"w{i}", cap, u) for i, u in enumerate(used))
    return KvView(workers, programs, KvConfig(**cfg))


def test_registry_builds_every_policy_by_name() -> None:
    assert set(KV_POLICIES) == {"vllm-default", "sticky", "continuum-ttl", "thunderagent",
                                "autellix-plas", "prefix-router", "agentd"}
    for name in KV_POLICIES:
        assert make_kv_policy(name).name == name
    with pytest.raises(KeyError, match="unknown kv policy"):
        make_kv_policy("nope")


def test_vllm_default_routes_every_request_least_loaded() -> None:
    v = view(prog("a", A, 100, worker="w0"), used=(300, 200))
    assert VllmDefaultPolicy().route(v, "a", NOW) == "w1"


def test_vllm_default_admits_everything_and_never_pauses() -> None:
    v = view(prog("r", R, 900), prog("a", A, 900), prog("q1", Q, 900), prog("q2", Q, 900),
             used=(1800, 0))
    assert VllmDefaultPolicy().decide(v, NOW) == [Admit("q1", "w1", "admit-all"),
                                              Admit("q2", "w1", "admit-all")]


def test_sticky_keeps_a_program_on_its_first_worker() -> None:
    v = view(prog("a", A, 100, worker="w0"), prog("q", Q, 10), used=(900, 0))
    assert StickyPolicy().route(v, "a", NOW) == "w0"
    assert StickyPolicy().route(v, "q", NOW) == "w1"


def test_continuum_pins_for_predicted_tool_time_then_pauses() -> None:
    policy = ContinuumTtlPolicy()
    v = view(prog("a", A, 100, acting_since=NOW - 3.0, tool_time_mean_s=4.0),
             prog("b", A, 100, acting_since=NOW - 3.0))  # default TTL 2 s
    assert policy.decide(v, NOW) == [Pause("b", "w0", "ttl-expired")]
    assert policy.route(v, "a", NOW) == "w0"


def test_continuum_admission_waits_while_pinned_and_reasoning_fill_capacity() -> None:
    policy = ContinuumTtlPolicy()
    full = view(prog("r", R, 600, worker="w0"), prog("a", A, 300, worker="w0"),
                prog("q", Q, 200), used=(0,))
    assert policy.decide(full, NOW) == []
    assert policy.route(full, "q", NOW) is None
    later = NOW + 10.0  # the TTL of "a" expired: its room is no longer reserved
    assert policy.decide(full, later) == [Pause("a", "w0", "ttl-expired"),
                                         Admit("q", "w0", "ttl-admit")]


def test_continuum_restores_sticky_to_the_old_worker_only() -> None:
    v = view(prog("r", R, 950, worker="w0"),
             prog("p", P, 100, worker="w0", pending_request=True))
    assert ContinuumTtlPolicy().decide(v, NOW) == []


def test_agentd_spreads_new_programs_and_best_fits_restores() -> None:
    # w0 holds 500, w1 holds 200: a new program goes to w1 (most room), while a
    # restore without cached blocks anywhere goes to the tighter fit, w0.
    v = view(prog("x", R, 500, worker="w0"), prog("y", R, 200, worker="w1"),
             prog("q", Q, 100), prog("p", P, 100, worker=None, pending_request=True),
             used=(0, 0))
    assert AgentdPolicy().decide(v, NOW) == [Restore("p", "w0", "restore"), Admit("q", "w1")]
    packed = AgentdPolicy(AgentdOptions(spread_admission=False))
    assert packed.decide(v, NOW) == [Restore("p", "w0", "restore"), Admit("q", "w0")]


def test_agentd_spread_alternates_a_burst_over_empty_workers() -> None:
    burst = [prog(f"q{i}", Q, 100) for i in range(4)]
    placed = [d.worker_id for d in AgentdPolicy().decide(view(*burst, used=(0, 0)), NOW)
              if isinstance(d, Admit)]
    assert sorted(placed) == ["w0", "w0", "w1", "w1"]


def test_agentd_counts_a_shared_prefix_once() -> None:
    group: dict[str, Any] = {"prefix_group": "sys", "prefix_tokens": 300}
    v = view(prog("r1", R, 500, **group), prog("r2", R, 500, **group),
             prog("q", Q, 400, **group), used=(0,))
    # 300 shared + 200 + 200 resident; q adds only its own 100.
    assert AgentdPolicy(AgentdOptions(share_prefix=True)).decide(v, NOW) == [Admit("q", "w0")]
    assert AgentdPolicy().decide(v, NOW) == []  # off by default
    assert ThunderAgentPolicy().decide(v, NOW) == []


def test_agentd_restores_where_least_must_be_recomputed() -> None:
    group: dict[str, Any] = {"prefix_group": "sys", "prefix_tokens": 300}
    v = view(prog("y", R, 450, worker="w0"), prog("x", R, 400, worker="w1", **group),
             prog("p", P, 500, worker=None, pending_request=True, **group), used=(0, 0))
    # w0 is the tighter fit, but w1 already holds 300 of p's 500 tokens.
    shared = AgentdPolicy(AgentdOptions(share_prefix=True))
    assert shared.decide(v, NOW) == [Restore("p", "w1", "restore")]
    plain = AgentdPolicy(AgentdOptions(migration_cost=False, share_prefix=False))
    assert plain.decide(v, NOW) == [Restore("p", "w0", "restore")]
    assert ThunderAgentPolicy().decide(v, NOW) == [Restore("p", "w0", "restore")]


def test_agentd_smooths_admission_bursts() -> None:
    burst = [prog(f"q{i}", Q, 10) for i in range(6)]
    v = view(*burst, used=(0,))
    smooth = AgentdOptions(smooth_admission=True, admits_per_tick=2)
    assert len(AgentdPolicy(smooth).decide(v, NOW)) == 2
    assert len(AgentdPolicy().decide(v, NOW)) == 6  # off by default


def test_migrating_a_reasoning_program_waits_for_its_request_unless_now() -> None:
    v = view(prog("r", R, 400, worker="w0"), used=(0, 0))
    later = plan_migration(v, "r", "w1")
    assert later.decisions == (MarkPauseAfterRequest("r", "migrate", restore_on="w1"),)
    assert plan_migration(v, "r", "w1", now=True).decisions == (
        Pause("r", "w0", "migrate"), Restore("r", "w1", "migrate"))
    assert later.recompute_tokens == 400


def test_migration_recompute_excludes_a_prefix_held_on_the_target() -> None:
    group: dict[str, Any] = {"prefix_group": "sys", "prefix_tokens": 300}
    v = view(prog("a", A, 400, worker="w0", **group), prog("b", R, 350, worker="w1", **group))
    plan = plan_migration(v, "a", "w1", now=True)
    assert plan.recompute_tokens == 100
    assert plan_migration(v, "a", "w0").decisions == ()


def test_marked_migration_restores_on_target_when_request_ends() -> None:
    v = view(prog("r", A, 400, pause_marked=True, migrate_to="w1"))
    assert ThunderAgentPolicy().on_request_end(v, "r", NOW) == [
        Pause("r", "w0", "marked"), Restore("r", "w1", "migrate")]
