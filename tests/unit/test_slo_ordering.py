"""Each ordering policy's order, and in-place switching between them."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.slo.ordering import (
    Edf,
    Fcfs,
    KeyedPolicy,
    Llf,
    Mlfq,
    OrderingPolicy,
    RequestQueue,
    Sjf,
    Srtf,
    StrictPriority,
    TwoLane,
    Wfq,
    default_registry,
    switch,
)
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import Slo, TaskType


def req(
    rid: str,
    arrival: float = 0.0,
    l_pred: int = 100,
    slo_ttft: float = 5.0,
    tenant: str = "a",
    priority: int = 0,
    generated: int = 0,
    tpot_pred: float = 0.01,
) -> QueuedRequest:
    return QueuedRequest(
        request_id=rid,
        tenant=tenant,
        arrival_s=arrival,
        prompt_tokens=10,
        task=TaskType.QA,
        importance=0.75,
        slo=Slo(slo_ttft, 0.05),
        l_pred=l_pred,
        l_upper=2 * l_pred,
        ttft_pred_s=0.1,
        tpot_pred_s=tpot_pred,
        priority=priority,
        generated_tokens=generated,
    )


def drain_ids(policy: OrderingPolicy, now: float = 0.0) -> list[str]:
    return [policy.pop(now).request_id for _ in range(len(policy))]


def fill(policy: OrderingPolicy, *requests: QueuedRequest) -> OrderingPolicy:
    for r in requests:
        policy.push(r, 0.0)
    return policy


def test_fcfs_by_arrival_with_id_tiebreak() -> None:
    p = fill(Fcfs(), req("c", 2.0), req("b", 1.0), req("a", 1.0))
    assert drain_ids(p) == ["a", "b", "c"]


def test_edf_by_deadline() -> None:
    # Deadlines: x = 0 + 5 + 0.05*100 = 10, y = 1 + 1 + 5 = 7, z = 2 + 5 + 0.5 = 7.5.
    p = fill(Edf(), req("x"), req("y", 1.0, slo_ttft=1.0), req("z", 2.0, l_pred=10))
    assert drain_ids(p) == ["y", "z", "x"]


def test_sjf_by_t_tot() -> None:
    p = fill(Sjf(), req("long", 0.0, 900), req("short", 1.0, 10), req("mid", 2.0, 100))
    assert drain_ids(p) == ["short", "mid", "long"]


def test_srtf_uses_remaining_not_total() -> None:
    fresh = req("fresh", 0.0, l_pred=100)
    nearly_done = req("resumed", 1.0, l_pred=500, generated=480)
    assert drain_ids(fill(Sjf(), fresh, nearly_done)) == ["fresh", "resumed"]
    assert drain_ids(fill(Srtf(), fresh, nearly_done)) == ["resumed", "fresh"]


def test_llf_by_laxity() -> None:
    # Laxity (minus now): a = 10 - 1.1 = 8.9, b = 0 + 5 + 25 - (0.1 + 5) = 24.9,
    # c = 0.5 + 1 + 5 - 1.1 = 5.4.
    p = fill(Llf(), req("a"), req("b", l_pred=500), req("c", 0.5, slo_ttft=1.0))
    assert drain_ids(p) == ["c", "a", "b"]


def test_llf_differs_from_edf_when_work_differs() -> None:
    # Same deadline 10; the longer one has less laxity.
    short = req("short", 0.0, l_pred=100, slo_ttft=5.0)
    long_ = req("long", 0.0, l_pred=100, slo_ttft=5.0, tpot_pred=0.08)
    assert drain_ids(fill(Llf(), short, long_)) == ["long", "short"]


def test_strict_priority_then_fcfs() -> None:
    p = fill(
        StrictPriority(), req("lo", 0.0), req("hi2", 2.0, priority=5), req("hi1", 1.0, priority=5)
    )
    assert drain_ids(p) == ["hi1", "hi2", "lo"]


def test_mlfq_demotes_by_attained_service() -> None:
    m = Mlfq(levels=3, quantum_tokens=64)
    assert [m.level(req("x", generated=g)) for g in (0, 63, 64, 192, 10_000)] == [0, 0, 1, 2, 2]
    p = fill(
        m,
        req("old_heavy", 0.0, generated=500),
        req("new", 5.0),
        req("old_light", 1.0, generated=10),
    )
    assert drain_ids(p) == ["old_light", "new", "old_heavy"]


def test_wfq_shares_by_weight() -> None:
    p = Wfq({"gold": 2.0, "free": 1.0}, unit_cost=True)
    for i in range(6):
        p.push(req(f"g{i}", float(i), tenant="gold"), 0.0)
        p.push(req(f"f{i}", float(i), tenant="free"), 0.0)
    first_six = [p.pop(0.0).tenant for _ in range(6)]
    assert Counter(first_six) == {"gold": 4, "free": 2}


def test_wfq_does_not_let_a_flooding_tenant_starve_another() -> None:
    p = Wfq(unit_cost=True)
    for i in range(50):
        p.push(req(f"bulk{i}", 0.0, tenant="bulk"), 0.0)
    p.push(req("late", 10.0, tenant="small"), 0.0)
    order = drain_ids(p)
    assert order.index("late") <= 1


def test_wfq_costs_by_work() -> None:
    p = Wfq()
    p.push(req("big", 0.0, l_pred=1000, tenant="a"), 0.0)
    p.push(req("small1", 0.0, l_pred=10, tenant="b"), 0.0)
    p.push(req("small2", 0.1, l_pred=10, tenant="b"), 0.0)
    assert drain_ids(p) == ["small1", "small2", "big"]


def test_two_lane_fast_lane_first_and_gate_serves_slow() -> None:
    p = TwoLane(threshold_s=2.0, slow_every=3)
    for i in range(4):
        p.push(req(f"fast{i}", float(i), l_pred=10), 0.0)
    p.push(req("slow", 0.0, l_pred=1000), 0.0)
    assert p.peek(0.0) is not None and p.peek(0.0).request_id == "fast0"  # type: ignore[union-attr]
    assert drain_ids(p) == ["fast0", "fast1", "slow", "fast2", "fast3"]


def test_two_lane_orders_within_lane_by_t_tot_then_slack() -> None:
    p = TwoLane(threshold_s=100.0)
    # Equal T_tot (1.1): slack (minus V_sys) decides, a = 10 - 1.1 = 8.9; b = 1 + 1 + 5 - 1.1
    # = 5.9. The shorter c (T_tot 0.2) goes first although it has the most slack.
    fill(p, req("a", 0.0), req("b", 1.0, slo_ttft=1.0), req("c", 2.0, l_pred=10))
    assert drain_ids(p) == ["c", "b", "a"]


def test_two_lane_moves_requests_that_missed_their_ttft_to_a_late_queue() -> None:
    p = TwoLane(threshold_s=100.0)
    # At now=3: "lost" (arrived 0, TTFT SLO 1 s) can no longer make it; the others can.
    fill(p, req("lost", 0.0, l_pred=10, slo_ttft=1.0), req("ok", 0.5, l_pred=50),
         req("ok2", 0.2, l_pred=90))
    assert [p.pop(3.0).request_id for _ in range(3)] == ["ok", "ok2", "lost"]
    assert len(p) == 0
    # Pushed when already late: behind every on-time request, late ones oldest first.
    p.push(req("late_new", 1.0, slo_ttft=0.5), 5.0)
    p.push(req("late_old", 0.0, slo_ttft=0.5), 5.0)
    p.push(req("fresh", 4.9, l_pred=900), 5.0)
    assert drain_ids(p, 5.0) == ["fresh", "late_old", "late_new"]


def test_pop_on_empty_raises() -> None:
    for name in default_registry().names():
        policy = default_registry().create(name)
        assert policy.peek(0.0) is None
        with pytest.raises(IndexError):
            policy.pop(0.0)


def test_registry_names_and_unknown() -> None:
    reg = default_registry()
    assert {
        "fcfs",
        "edf",
        "sjf",
        "srtf",
        "llf",
        "two_lane",
        "wfq",
        "stride",
        "priority",
        "mlfq",
    } <= set(reg.names())
    assert "nope" not in reg
    with pytest.raises(KeyError):
        reg.create("nope")


def test_remove_takes_out_one_request() -> None:
    p = fill(Edf(), req("a"), req("b", 1.0), req("c", 2.0))
    removed = p.remove("b", 0.0)
    assert removed is not None and removed.request_id == "b"
    assert p.remove("zzz", 0.0) is None
    assert drain_ids(p) == ["a", "c"]


requests_st = st.lists(
    st.builds(
        req,
        rid=st.uuids().map(str),
        arrival=st.floats(0, 100),
        l_pred=st.integers(1, 4000),
        slo_ttft=st.floats(0.1, 20),
        tenant=st.sampled_from(["a", "b", "c"]),
        priority=st.integers(0, 3),
        generated=st.integers(0, 300),
    ),
    max_size=40,
    unique_by=lambda r: r.request_id,
)
names_st = st.sampled_from(default_registry().names())


@settings(max_examples=150, deadline=None)
@given(requests=requests_st, old=names_st, new=names_st, popped=st.integers(0, 10))
def test_switch_keeps_multiset_and_follows_new_rule(
    requests: list[QueuedRequest], old: str, new: str, popped: int
) -> None:
    reg = default_registry()
    queue = RequestQueue(reg.create(old))
    for r in requests:
        queue.push(r, 0.0)
    taken = [queue.pop(0.0) for _ in range(min(popped, len(queue)))]
    waiting = Counter(r.request_id for r in requests) - Counter(r.request_id for r in taken)

    switch(queue, reg.create(new), 1.0)

    assert queue.policy.name == new
    after = drain_ids(queue.policy, 1.0)
    assert Counter(after) == waiting
    remaining = [r for r in requests if waiting[r.request_id] > 0]
    reference = reg.create(new)
    reference.rebuild(remaining, 1.0)
    assert after == drain_ids(reference, 1.0)
    if isinstance(reference, KeyedPolicy) and not isinstance(reference, Wfq):
        # Stateless keys: the order must be the sort by (key, arrival, id), heap or no heap.
        by_rule = sorted(remaining, key=lambda r: (reference.key(r), r.arrival_s, r.request_id))
        assert after == [r.request_id for r in by_rule]
