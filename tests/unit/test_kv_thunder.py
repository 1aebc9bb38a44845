"""ThunderAgent policy: thrashing check, pause and restore order, placement."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.kv import (
    Admit,
    KvConfig,
    KvView,
    MarkPauseAfterRequest,
    Pause,
    ProgramStatus,
    ProgramView,
    Restore,
    ThunderAgentPolicy,
    WorkerView,
    decay,
)
from scheduling.kv.decisions import placements
from tests.kv_programs import NOW, A, P, Q, R, prog


def view(*programs: ProgramView, caps: tuple[int, ...] = (1000,), **cfg: Any) -> KvView:
    workers = tuple(WorkerView(f"w{i}", cap) for i, cap in enumerate(caps))
    return KvView(workers, programs, KvConfig(**cfg))


def decide(v: KvView, now: float = NOW) -> list[Any]:
    return ThunderAgentPolicy().decide(v, now)


def test_decay_bounds_and_half_life() -> None:
    assert decay(0.0, 0.1) == 1.0
    assert decay(1e6, 0.1) == pytest.approx(0.0)
    assert decay(math.log(2) / 0.1, 0.1) == pytest.approx(0.5)


def test_decayed_acting_tokens_decide_thrashing() -> None:
    # 600 reasoning + 800 acting for ln2/λ s weighs 600 + 400 = 1000: not over.
    half = math.log(2) / 0.1
    acting = prog("a", A, 800, acting_since=NOW - half)
    assert decide(view(prog("r", R, 600), acting)) == []
    fresher = prog("a", A, 800, acting_since=NOW - half + 1.0)
    assert decide(view(prog("r", R, 600), fresher)) == [Pause("a", "w0", "thrashing")]


def test_pauses_acting_before_reasoning_shortest_first() -> None:
    v = view(prog("r-small", R, 100), prog("a-big", A, 400), prog("a-small", A, 300),
             prog("r-big", R, 600))
    # demand 1400 > 1000: a-small (300) leaves 1100, a-big (400) leaves 700.
    assert decide(v) == [Pause("a-small", "w0", "thrashing"), Pause("a-big", "w0", "thrashing")]


def test_reasoning_programs_are_marked_shortest_first() -> None:
    v = view(prog("a", A, 100), prog("r1", R, 450), prog("r2", R, 400), prog("r3", R, 300))
    assert decide(v) == [Pause("a", "w0", "thrashing"), MarkPauseAfterRequest("r3", "thrashing")]


def test_marked_program_is_paused_when_its_request_ends() -> None:
    policy = ThunderAgentPolicy()
    marked = view(prog("r", A, 300, pause_marked=True), prog("s", A, 10))
    assert policy.on_request_end(marked, "r", NOW) == [Pause("r", "w0", "marked")]
    assert policy.on_request_end(marked, "s", NOW) == []


def test_already_marked_programs_count_as_gone() -> None:
    v = view(prog("r1", R, 700, pause_marked=True), prog("r2", R, 600))
    assert decide(v) == []


def test_pinned_programs_are_never_paused() -> None:
    v = view(prog("a", A, 900, pinned=True), prog("r", R, 800, pinned=True))
    assert decide(v) == []


def test_restore_order_pending_then_new_then_acting_shortest_first() -> None:
    waiting = [
        prog("acting-short", P, 50, worker=None),
        prog("new-long", Q, 300),
        prog("new-short", Q, 100),
        prog("pending-long", P, 400, worker=None, pending_request=True),
        prog("pending-short", P, 200, worker=None, pending_request=True),
    ]
    order = [d.program_id for d in decide(view(*waiting, caps=(10_000,)))]
    assert order == ["pending-short", "pending-long", "new-short", "new-long", "acting-short"]


def test_restore_stops_at_low_watermark() -> None:
    v = view(prog("r", R, 500), prog("q1", Q, 200), prog("q2", Q, 250), low_watermark=0.8)
    assert decide(v) == [Admit("q1", "w0")]


def test_restored_program_lands_on_best_fit_worker() -> None:
    v = view(prog("x", P, 300, worker=None, pending_request=True), caps=(1000, 400, 350))
    assert decide(v) == [Restore("x", "w2", "restore")]


def test_locality_preferred_when_old_worker_has_room() -> None:
    v = view(prog("x", P, 300, worker="w0", pending_request=True), caps=(1000, 350))
    assert decide(v) == [Restore("x", "w0", "restore")]


def test_unhealthy_worker_is_drained_and_skipped() -> None:
    workers = (WorkerView("w0", 1000, healthy=False), WorkerView("w1", 1000))
    v = KvView(workers, (prog("a", A, 100), prog("q", Q, 100)))
    assert decide(v) == [Pause("a", "w0", "thrashing"), Admit("q", "w1")]


def test_force_resume_evicts_to_place_an_overdue_program() -> None:
    v = view(prog("r", R, 700), prog("a", A, 200),
             prog("late", P, 300, worker=None, pending_request=True, ready_since=NOW - 31))
    # No room under the watermark, but "late" waited past force_resume_s (30 s).
    assert decide(v) == [Pause("a", "w0", "force-resume"), Restore("late", "w0", "force-resume")]
    assert decide(v, now=NOW - 2) == []


def test_route_keeps_admitted_programs_on_their_worker() -> None:
    policy = ThunderAgentPolicy()
    v = view(prog("a", A, 100, worker="w1"), prog("q", Q, 100), prog("big", Q, 5000),
             caps=(1000, 1000))
    assert policy.route(v, "a", NOW) == "w1"
    assert policy.route(v, "q", NOW) == "w1"  # best fit: w1 already holds "a"
    assert policy.route(v, "big", NOW) is None


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.tuples(st.sampled_from([Q, P, A, R]), st.integers(50, 600)),
                      min_size=1, max_size=12))
def test_route_places_as_a_full_restore_pass_would(sizes: list[tuple[ProgramStatus, int]]) -> None:
    # route stops its restore pass at the routed program; nothing later may matter.
    programs = [prog(f"p{i}", s, n, worker=None if s is P else f"w{i % 2}",
                     pending_request=s is P)
                for i, (s, n) in enumerate(sizes)]
    v = view(*programs, caps=(900, 700))
    policy = ThunderAgentPolicy()
    plan = policy._plan(v, NOW)
    policy._restore(plan)
    full = placements(plan.decisions)
    for p in programs:
        if p.waiting:
            assert policy.route(v, p.program_id, NOW) == full.get(p.program_id)
