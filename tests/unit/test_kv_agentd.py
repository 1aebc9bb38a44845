"""agentd's additions to ThunderAgent: hold then release on demand, pause and restore
order, no overcommit, the queue-scaled wait bound, request rebalancing."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.kv import (
    Admit,
    AgentdOptions,
    AgentdPolicy,
    KvConfig,
    KvView,
    MarkPauseAfterRequest,
    Pause,
    ProgramView,
    Restore,
    ThunderAgentPolicy,
    WorkerView,
)
from scheduling.kv.fairness import swap_after_s
from tests.kv_programs import NOW, A, P, Q, R, prog


def late(pid: str, tokens: int, waited_s: float, **kw: Any) -> ProgramView:
    return prog(pid, P, tokens, pending_request=True, ready_since=NOW - waited_s, **kw)


def view(*programs: ProgramView, used: tuple[int, ...] = (0,), **cfg: Any) -> KvView:
    workers = tuple(WorkerView(f"w{i}", 1000, u) for i, u in enumerate(used))
    return KvView(workers, programs, KvConfig(**cfg))


def agentd(**options: Any) -> AgentdPolicy:
    # The views here fill workers to exactly their capacity; `headroom` has its own test.
    options.setdefault("headroom", 0.0)
    return AgentdPolicy(AgentdOptions(**options))


def test_a_program_past_its_hold_is_released_only_when_a_waiting_program_needs_it() -> None:
    resident = (prog("r", R, 500), prog("a", A, 300, acting_since=NOW - 1),
                prog("b", A, 200, acting_since=NOW - 20))
    assert agentd().decide(view(*resident), NOW) == []  # b is past its hold, nobody waits
    fits = view(*resident, prog("q", Q, 200))
    assert agentd().decide(fits, NOW) == [Pause("b", "w0", "released"), Admit("q", "w0")]
    # "a" is still inside its 15 s hold: its room is not taken, even for a smaller need.
    too_big = view(*resident, prog("q", Q, 250))
    assert agentd().decide(too_big, NOW) == []


def test_release_on_demand_takes_the_room_instead_of_lending_a_decayed_share() -> None:
    # 25 s past its hold, ThunderAgent-style decay counts b as 16 tokens and admits q
    # beside it, so b's return overcommits the worker; agentd pauses b first.
    v = view(prog("r", R, 500), prog("a", A, 300, acting_since=NOW - 1),
             prog("b", A, 200, acting_since=NOW - 30), prog("q", Q, 150))
    assert agentd().decide(v, NOW) == [Pause("b", "w0", "released"), Admit("q", "w0")]
    assert agentd(release_on_demand=False).decide(v, NOW) == [Admit("q", "w0")]


def test_hold_is_hold_s_or_with_predicted_hold_the_programs_own_tool_time() -> None:
    quick = prog("p", A, 100, acting_since=NOW - 2, tool_time_mean_s=1.0)
    fresh = prog("n", A, 100, acting_since=NOW - 2)
    v = view(quick, fresh, prog("o", A, 100, tool_time_mean_s=3.0))
    assert agentd().held(quick, v, NOW) and not agentd().held(quick, v, NOW + 13.5)
    predicted = agentd(predicted_hold=True)
    assert not predicted.held(quick, v, NOW)  # its tools take 1 s; 2 s in, it is late
    assert predicted.held(fresh, v, NOW)  # no history: hold_s
    # The fleet prior predicts the mean of the programs' means (2 s): just expired.
    assert not agentd(predicted_hold=True, fleet_prior=True).held(fresh, v, NOW)
    assert agentd(predicted_hold=True, fleet_prior=True).held(fresh, v, NOW - 0.5)


def test_acting_programs_are_paused_longest_acting_first() -> None:
    v = view(prog("r", R, 600), prog("a", A, 200, acting_since=NOW - 1),
             prog("b", A, 300, acting_since=NOW - 3))
    assert agentd().decide(v, NOW) == [Pause("b", "w0", "thrashing")]
    assert agentd(longest_acting_first=False).decide(v, NOW) == [Pause("a", "w0", "thrashing")]
    assert ThunderAgentPolicy().decide(v, NOW) == [Pause("a", "w0", "thrashing")]


def test_reasoning_programs_are_marked_longest_running_first() -> None:
    # r1's request started after a tool that began 20 s ago; r2's first request just began.
    v = view(prog("r1", R, 500, acting_since=NOW - 20), prog("r2", R, 400),
             prog("r3", R, 300, acting_since=NOW - 2))
    assert agentd().decide(v, NOW) == [MarkPauseAfterRequest("r1", "thrashing")]
    assert ThunderAgentPolicy().decide(v, NOW) == [MarkPauseAfterRequest("r3", "thrashing")]


def test_paused_programs_whose_blocks_are_still_cached_are_restored_first() -> None:
    v = view(prog("r", R, 600), late("p1", 300, 1), late("p2", 350, 1, kv_resident=True))
    assert agentd().decide(v, NOW) == [Restore("p2", "w0", "restore")]
    unordered = agentd(cached_first=False, cold_with_new=False)
    assert unordered.decide(v, NOW) == [Restore("p1", "w0", "restore")]


def test_an_evicted_program_returns_to_its_last_worker_when_recompute_ties() -> None:
    # Its prefix may survive there (the LRU drops a freed request's tail first).
    v = view(prog("x", R, 500, worker="w0"), prog("y", R, 200, worker="w1"),
             late("p", 100, 1, worker="w1"), used=(0, 0))
    assert agentd().decide(v, NOW) == [Restore("p", "w1", "restore")]
    assert agentd(migration_cost=False).decide(v, NOW) == [Restore("p", "w1", "restore")]


def test_room_of_a_marked_program_is_not_used_while_its_request_runs() -> None:
    v = view(prog("m", R, 500, pause_marked=True), prog("r", R, 300), prog("q", Q, 300))
    assert agentd().decide(v, NOW) == []
    assert agentd().route(v, "q", NOW) is None
    assert ThunderAgentPolicy().decide(v, NOW) == [Admit("q", "w0")]


def test_swap_wait_scales_with_the_programs_waiting_per_worker() -> None:
    one = view(late("a", 100, 1), used=(0, 0))
    assert swap_after_s(one) == 30.0
    five = view(*(late(f"p{i}", 100, 1) for i in range(5)), used=(0, 0))
    assert swap_after_s(five) == 75.0


def test_a_due_program_swaps_with_the_longest_acting_program() -> None:
    v = view(prog("r", R, 500), prog("a1", A, 250, acting_since=NOW - 1),
             prog("a2", A, 250, acting_since=NOW - 3), late("late", 200, 31))
    assert agentd().decide(v, NOW) == [Pause("a2", "w0", "swap"), Restore("late", "w0", "swap")]
    assert agentd().decide(v, NOW - 2) == []  # waited 29 s


def test_a_swap_with_a_running_program_waits_for_its_request_to_end() -> None:
    start = view(prog("r1", R, 600), prog("r2", R, 400), late("late", 300, 31))
    assert agentd().decide(start, NOW) == [MarkPauseAfterRequest("r2", "swap")]
    marked = view(prog("r1", R, 600), prog("r2", R, 420, pause_marked=True),
                  late("late", 300, 32))
    assert agentd().decide(marked, NOW + 1) == []  # nothing else is marked, nothing placed
    ended = view(prog("r1", R, 600), prog("r2", P, 420), late("late", 300, 33))
    assert agentd().decide(ended, NOW + 2) == [Restore("late", "w0", "overdue")]
    # ThunderAgent places at once, next to the still-running r2.
    assert ThunderAgentPolicy().decide(start, NOW) == [
        MarkPauseAfterRequest("r2", "force-resume"), Restore("late", "w0", "force-resume")]


def test_a_reserved_worker_takes_no_other_program() -> None:
    # late (due: 2 waiting, 1 worker, 61 s) needs 300; 100 is free now, and q would fit.
    v = view(prog("r1", R, 500), prog("r2", R, 400, pause_marked=True),
             late("late", 300, 61), prog("q", Q, 100))
    assert agentd().decide(v, NOW) == []
    assert agentd().route(v, "q", NOW) is None
    not_due = view(*v.programs[:2], late("late", 300, 59), prog("q", Q, 100))
    assert agentd().decide(not_due, NOW) == [Admit("q", "w0")]


def test_overdue_first_serves_late_programs_oldest_first() -> None:
    v = view(prog("r", R, 700), late("o1", 250, 40), late("o2", 200, 35))
    assert agentd().decide(v, NOW) == [Restore("o2", "w0", "restore")]  # shortest first
    assert agentd(overdue_first=True).decide(v, NOW) == [Restore("o1", "w0", "overdue")]


def test_a_ready_request_moves_to_a_much_less_used_worker_that_has_room() -> None:
    back = prog("a", A, 200, worker="w0", pending_request=True, ready_since=NOW)
    skewed = view(back, used=(600, 100))
    assert agentd().route(skewed, "a", NOW) == "w1"
    assert agentd(balance_route=0.0).route(skewed, "a", NOW) == "w0"
    assert agentd().route(view(back, used=(300, 200)), "a", NOW) == "w0"  # would not narrow
    full = view(back, prog("big", R, 900, worker="w1"), used=(600, 100))
    assert agentd().route(full, "a", NOW) == "w0"


def test_the_balance_gap_is_taken_before_the_request_whatever_its_length() -> None:
    # Capacity 1000, threshold 0.12. A gap of 0.15 moves a short and a mid-length
    # context alike; one of 0.11 moves neither (taken after the request, 0.11 + 0.1
    # would have moved the mid-length one, whose move recomputes five times as much).
    def ready(name: str, tokens: int) -> ProgramView:
        return prog(name, A, tokens, worker="w0", pending_request=True, ready_since=NOW)

    for pid, tokens in (("short", 20), ("mid", 100)):
        assert agentd().route(view(ready(pid, tokens), used=(600, 450)), pid, NOW) == "w1"
        assert agentd().route(view(ready(pid, tokens), used=(600, 490)), pid, NOW) == "w0"


def test_a_cold_paused_program_queues_with_new_programs_shortest_first() -> None:
    # Room for one more: the cached paused program first, then the shortest of the
    # cold paused one and the new one; ThunderAgent's order puts every paused one first.
    base = (prog("r", R, 700), prog("q", Q, 150), late("cold", 200, 1, kv_resident=False))
    v = view(*base)
    assert agentd().decide(v, NOW) == [Admit("q", "w0")]
    assert agentd(cold_with_new=False).decide(v, NOW) == [Restore("cold", "w0", "restore")]
    cached = view(*base, late("warm", 300, 1, kv_resident=True))
    assert agentd().decide(cached, NOW) == [Restore("warm", "w0", "restore")]


def test_an_unknown_residency_keeps_the_issues_restore_order() -> None:
    # The daemon may not know whether a paused program is still cached (None): it is not
    # demoted to rank with new programs, so it is restored before the shorter new one.
    v = view(prog("r", R, 700), prog("q", Q, 150), late("p", 200, 1))
    assert v.program("p").kv_resident is None
    assert agentd().decide(v, NOW) == [Restore("p", "w0", "restore")]
    assert agentd().restore_key(v.program("p")) < agentd().restore_key(v.program("q"))


def test_an_unknown_residency_is_restored_after_a_known_cached_one_shortest_first() -> None:
    v = view(prog("r", R, 500), late("u", 200, 1), late("warm", 300, 1, kv_resident=True),
             late("u2", 100, 1))
    order = sorted(v.programs[1:], key=agentd().restore_key)
    assert [p.program_id for p in order] == ["warm", "u2", "u"]


def test_an_unknown_residency_gets_no_home_preference() -> None:
    # Unknown on a full w0: restored on w1 with room (as a cold one), never held for w0.
    v = view(prog("x", R, 900, worker="w0"), late("p", 200, 1, worker="w0"), used=(0, 0))
    assert agentd().decide(v, NOW) == [Restore("p", "w1", "restore")]


def test_a_cached_paused_program_waits_for_its_own_worker() -> None:
    # w0 is full of running requests (nothing to release); w1 has room. Restored on w1,
    # p would recompute everything its w0 blocks still hold.
    v = view(prog("x", R, 900, worker="w0"), late("p", 200, 1, worker="w0", kv_resident=True),
             used=(0, 0))
    assert agentd().decide(v, NOW) == []
    assert agentd(home_cached=False).decide(v, NOW) == [Restore("p", "w1", "restore")]
    cold = view(prog("x", R, 900, worker="w0"), late("p", 200, 1, worker="w0"), used=(0, 0))
    assert agentd().decide(cold, NOW) == [Restore("p", "w1", "restore")]


def test_with_new_wait_only_a_started_program_takes_a_held_out_programs_room() -> None:
    resident = (prog("r", R, 600), prog("b", A, 300, acting_since=NOW - 20))
    new = view(*resident, prog("q", Q, 200))
    assert agentd(new_wait=True).decide(new, NOW) == []
    assert agentd().decide(new, NOW) == [Pause("b", "w0", "released"), Admit("q", "w0")]
    started = view(*resident, late("p", 200, 1))
    assert agentd(new_wait=True).decide(started, NOW) == [
        Pause("b", "w0", "released"), Restore("p", "w0", "restore")]


def test_thrash_slack_tolerates_a_small_overshoot_only() -> None:
    v = view(prog("r", R, 700), prog("a", A, 330, acting_since=NOW - 20))
    assert agentd(thrash_slack=0.05).decide(v, NOW) == []
    assert agentd().decide(v, NOW) == [Pause("a", "w0", "thrashing")]
    over = view(prog("r", R, 700), prog("a", A, 360, acting_since=NOW - 20))
    assert agentd(thrash_slack=0.05).decide(over, NOW) == [Pause("a", "w0", "thrashing")]
    assert ThunderAgentPolicy().thrash_watermark(v) == 1.0


def test_lasting_balance_moves_a_request_only_when_admitted_demand_is_skewed_too() -> None:
    back = prog("a", A, 200, worker="w0", pending_request=True, ready_since=NOW)
    # Usage is skewed (600 vs 100) only because w0's requests happen to run now: w1
    # holds as much admitted demand, its acting program "idle" included.
    momentary = view(back, prog("idle", A, 400, worker="w1"), used=(600, 100))
    assert agentd().route(momentary, "a", NOW) == "w1"
    assert agentd(lasting_balance=True).route(momentary, "a", NOW) == "w0"
    # w0 also holds "b" (500 admitted vs 0): a lasting skew, so the request moves.
    lasting = view(back, prog("b", A, 300, worker="w0"), used=(600, 100))
    assert agentd(lasting_balance=True).route(lasting, "a", NOW) == "w1"
    # At the threshold (200 of 1000 admitted vs 0) it stays.
    at_threshold = agentd(lasting_balance=True, balance_route=0.2)
    assert at_threshold.route(view(back, used=(600, 100)), "a", NOW) == "w0"
    assert agentd(lasting_balance=True, balance_route=0.0).route(lasting, "a", NOW) == "w0"


def test_headroom_keeps_placements_below_the_thrash_line() -> None:
    # Placements stop at (low watermark - headroom) x capacity; thrashing is still
    # judged at the high watermark, so growth inside the gap pauses nobody.
    admitted = (prog("r", R, 700), prog("a", A, 250, acting_since=NOW - 1))
    newcomer = view(*admitted, prog("q", Q, 40))
    assert agentd().decide(newcomer, NOW) == [Admit("q", "w0")]
    assert agentd(headroom=0.05).decide(newcomer, NOW) == []
    grown = view(prog("r", R, 700), prog("a", A, 290, acting_since=NOW - 20))
    assert agentd(headroom=0.05).decide(grown, NOW) == []
    over = view(prog("r", R, 700), prog("a", A, 310, acting_since=NOW - 20))
    assert agentd(headroom=0.05).decide(over, NOW) == [Pause("a", "w0", "thrashing")]


def test_headroom_bounds_release_on_demand_and_rebalancing_too() -> None:
    resident = (prog("r", R, 500), prog("b", A, 300, acting_since=NOW - 20),
                prog("a", A, 200, acting_since=NOW - 1))
    needs = view(*resident, prog("q", Q, 290))
    assert agentd().decide(needs, NOW) == [Pause("b", "w0", "released"), Admit("q", "w0")]
    # Releasing b leaves 250 under 950: not enough, so b keeps its room.
    assert agentd(headroom=0.05).decide(needs, NOW) == []
    back = prog("a", A, 200, worker="w0", pending_request=True, ready_since=NOW)
    skewed = view(back, prog("idle", A, 400, worker="w1"), used=(600, 100))
    assert agentd().route(skewed, "a", NOW) == "w1"
    assert agentd(headroom=0.45).route(skewed, "a", NOW) == "w0"


def _all_placed(policy: AgentdPolicy, v: KvView, now: float) -> dict[str, str]:
    """Routing's placements with every paused program placed too (as before routing
    left out those that no answer depends on)."""
    from scheduling.kv.decisions import placements
    from scheduling.kv.fairness import serve_overdue

    plan = policy._plan(v, now)
    if policy.options.fair_resume:
        serve_overdue(plan, now, policy.choose_worker, False, policy.options.overdue_first)
    policy._place_queue(plan, now, release=False)
    return placements(plan.decisions)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), workers=st.integers(1, 4),
       options=st.fixed_dictionaries({"cold_with_new": st.booleans(),
                                      "spread_admission": st.booleans(),
                                      "fair_resume": st.booleans(),
                                      "migration_cost": st.booleans()}))
def test_routing_answers_are_those_of_placing_every_paused_program(
        data: st.DataObject, workers: int, options: dict[str, bool]) -> None:
    """Route leaves out the paused programs without a request after the last one with a
    request in the restore order; every program it answers for gets the same worker."""
    kinds = st.sampled_from(["queued", "paused-pending", "paused-idle", "acting", "reasoning"])
    programs = []
    for i, kind in enumerate(data.draw(st.lists(kinds, min_size=1, max_size=14))):
        tokens = data.draw(st.integers(50, 700))
        worker = f"w{data.draw(st.integers(0, workers - 1))}"
        if kind == "queued":
            programs.append(prog(f"p{i}", Q, tokens))
        elif kind.startswith("paused"):
            programs.append(prog(
                f"p{i}", P, tokens, worker, pending_request=kind == "paused-pending",
                ready_since=NOW - data.draw(st.sampled_from([0.0, 5.0, 100.0])),
                kv_resident=data.draw(st.sampled_from([None, True, False]))))
        else:
            programs.append(prog(f"p{i}", A if kind == "acting" else R, tokens, worker))
    v = KvView(tuple(WorkerView(f"w{i}", 1000) for i in range(workers)), tuple(programs),
               KvConfig())
    policy = agentd(**options)
    expected = _all_placed(policy, v, NOW)
    for p in programs:
        if p.waiting:
            assert policy.route(v, p.program_id, NOW) == expected.get(p.program_id)
