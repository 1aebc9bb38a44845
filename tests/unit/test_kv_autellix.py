"""Autellix PLAS as a KV policy: program-level attained service decides the order."""

from __future__ import annotations

from typing import Any

from scheduling.kv import (
    Admit,
    AutellixPlasPolicy,
    KvConfig,
    KvView,
    Pause,
    PlasOptions,
    ProgramView,
    Restore,
    WorkerView,
    make_kv_policy,
)
from scheduling.kv.autellix import queue_index
from tests.kv_programs import NOW, A, P, Q, R, prog


def view(*programs: ProgramView, cap: int = 1000, workers: int = 1, **cfg: Any) -> KvView:
    return KvView(tuple(WorkerView(f"w{i}", cap) for i in range(workers)), programs,
                  KvConfig(**cfg))


def test_queues_grow_geometrically_and_the_last_one_takes_the_rest() -> None:
    options = PlasOptions(first_queue_tokens=100, queue_ratio=4.0, queues=3)
    assert [queue_index(s, options) for s in (0, 99, 100, 399, 400, 10**9)] == [0, 0, 1, 1, 2, 2]


def test_least_attained_program_goes_first_regardless_of_arrival() -> None:
    # "old" waits longer but its program has had far more service: the newcomer goes first
    old = prog("old", P, 600, pending_request=True, ready_since=NOW - 5)
    new = prog("new", Q, 300, ready_since=NOW - 1)
    policy = AutellixPlasPolicy(PlasOptions(first_queue_tokens=500, preempt=False))
    assert policy.decide(view(old, new, cap=800), NOW) == [Admit("new", "w0", "plas-admit")]


def test_within_a_queue_the_earlier_call_goes_first() -> None:
    a = prog("a", Q, 300, ready_since=NOW - 1)
    b = prog("b", Q, 300, ready_since=NOW - 2)
    policy = AutellixPlasPolicy(PlasOptions(preempt=False))
    assert policy.decide(view(a, b, cap=400), NOW) == [Admit("b", "w0", "plas-admit")]


def test_a_starved_program_is_promoted_to_the_top_queue() -> None:
    old = prog("old", P, 600, pending_request=True, ready_since=NOW - 31)
    new = prog("new", Q, 300, ready_since=NOW - 1)
    policy = AutellixPlasPolicy(PlasOptions(first_queue_tokens=500, preempt=False))
    assert policy.decide(view(old, new, cap=800, force_resume_s=30.0), NOW) == [
        Restore("old", "w0", "plas-restore")]


def test_a_program_is_paused_when_its_call_ends_unless_pinned() -> None:
    policy = AutellixPlasPolicy()
    v = view(prog("a", A, 100), prog("p", A, 100, pinned=True))
    assert policy.on_request_end(v, "a", NOW) == [Pause("a", "w0", "call-ended")]
    assert policy.on_request_end(v, "p", NOW) == []


def test_a_waiting_call_returns_to_its_last_worker_when_it_fits() -> None:
    paused = prog("a", P, 200, worker="w1", pending_request=True, ready_since=NOW)
    policy = AutellixPlasPolicy()
    assert policy.route(view(paused, workers=2), "a", NOW) == "w1"
    # no room on w1: the fitting worker with most room
    busy = prog("r", R, 900, worker="w1")
    assert policy.route(view(paused, busy, workers=2), "a", NOW) == "w0"


def test_higher_queue_preempts_the_most_served_running_program() -> None:
    running_big = prog("big", R, 700)
    running_small = prog("small", R, 200)
    newcomer = prog("new", Q, 300, ready_since=NOW)
    policy = AutellixPlasPolicy(PlasOptions(first_queue_tokens=250, queue_ratio=2.0))
    v = view(running_big, running_small, newcomer, cap=1000)
    assert policy.decide(v, NOW) == [Pause("big", "w0", "plas-preempt"),
                                     Admit("new", "w0", "plas-admit")]
    # routing places only: it never relies on a preemption not yet applied
    assert policy.route(v, "new", NOW) is None
    # no preemption within the same queue
    peer = prog("peer", Q, 700, ready_since=NOW)
    assert policy.decide(view(running_big, running_small, peer, cap=1000), NOW) == []


def test_acting_programs_left_over_hold_no_room() -> None:
    # a program still ACTING (its request ended before the policy was installed) is paused
    policy = AutellixPlasPolicy()
    v = view(prog("a", A, 900), prog("q", Q, 500, ready_since=NOW), cap=1000)
    assert policy.decide(v, NOW) == [Pause("a", "w0", "between-calls"),
                                     Admit("q", "w0", "plas-admit")]


def test_selectable_by_name() -> None:
    assert make_kv_policy("autellix-plas").name == "autellix-plas"
