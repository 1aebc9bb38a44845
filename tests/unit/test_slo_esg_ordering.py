"""The ESG-density ordering and two-lane's ESG-ordered late queue (issue 5, item 2)."""

from __future__ import annotations

import pytest

from scheduling.slo.metrics import CompletionRecord, base_value, service_gain
from scheduling.slo.ordering import (
    EsgDensity,
    OrderingPolicy,
    Sjf,
    TwoLane,
    default_registry,
    esg_density,
)
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import Slo, TaskType


def req(rid: str, arrival: float = 0.0, l_pred: int = 100, slo_ttft: float = 5.0,
        prompt: int = 10) -> QueuedRequest:
    # T_tot = 0.1 + 0.01 * l_pred; SLO_ttlt = slo_ttft + 0.05 * l_pred.
    return QueuedRequest(request_id=rid, tenant="a", arrival_s=arrival, prompt_tokens=prompt,
                         task=TaskType.QA, importance=0.75, slo=Slo(slo_ttft, 0.05),
                         l_pred=l_pred, l_upper=2 * l_pred, ttft_pred_s=0.1, tpot_pred_s=0.01)


def ids(policy: OrderingPolicy, now: float) -> list[str]:
    return [policy.pop(now).request_id for _ in range(len(policy))]


def test_density_is_the_esg_it_would_earn_now_per_second_of_service() -> None:
    r = req("r", arrival=0.0, l_pred=100, slo_ttft=1.0)  # V 210, T_tot 1.1, SLO_ttlt 6
    assert esg_density(r, 0.0) == pytest.approx(210 / 1.1)  # on time: the full value
    # Dispatched at 10 s its TTLT is 11.1 s: the same discount ESG itself applies.
    done = CompletionRecord("r", "a", "w", 0.0, 11.1, 10, 100, 10.1, 0.01, 1.0, 0.05)
    assert esg_density(r, 10.0) == pytest.approx(
        base_value(done) * service_gain(done) / 1.1)


def test_long_requests_first_where_sjf_serves_them_last() -> None:
    """V_base counts output twice, so more output is more ESG per second of service."""
    reqs = [req("short", 0.0, 10), req("mid", 0.0, 100), req("long", 0.0, 900)]
    esg, sjf = EsgDensity(), Sjf()
    for r in reqs:
        esg.push(r, 0.0)
        sjf.push(r, 0.0)
    assert ids(esg, 0.0) == ["long", "mid", "short"]
    assert ids(sjf, 0.0) == ["short", "mid", "long"]


def test_keys_follow_the_clock_every_refresh() -> None:
    """A late request's density decays as it waits: a tight-SLO request that led at 0 s
    falls behind a lax one by 10 s, once the keys are re-derived."""
    tight, lax = req("tight", l_pred=100, slo_ttft=1.0), req("lax", l_pred=10, slo_ttft=20.0)
    assert esg_density(tight, 0.0) > esg_density(lax, 0.0)
    assert esg_density(tight, 10.0) < esg_density(lax, 10.0)
    fresh, stale = EsgDensity(refresh_s=1.0), EsgDensity(refresh_s=100.0)
    for policy in (fresh, stale):
        policy.push(tight, 0.0)
        policy.push(lax, 0.0)
        assert policy.peek(0.0) is tight
    assert ids(fresh, 10.0) == ["lax", "tight"]
    assert ids(stale, 10.0) == ["tight", "lax"]  # keys of 0 s until 100 s have passed


def test_two_lane_esg_orders_its_late_queue_by_density() -> None:
    """Both lanes first; then, among requests past their TTFT, plain two-lane serves the
    oldest, two_lane_esg the one with the most ESG left per second of service."""
    reg = default_registry()
    plain, esg = reg.create("two_lane"), reg.create("two_lane_esg")
    assert isinstance(esg, TwoLane) and esg.name == "two_lane_esg" and plain.name == "two_lane"
    for policy in (plain, esg):
        policy.push(req("late_small", 0.0, l_pred=10, slo_ttft=0.5), 5.0)
        policy.push(req("late_big", 1.0, l_pred=900, slo_ttft=0.5), 5.0)
        policy.push(req("on_time", 4.9, l_pred=50), 5.0)
    assert ids(plain, 5.0) == ["on_time", "late_small", "late_big"]
    assert ids(esg, 5.0) == ["on_time", "late_big", "late_small"]
    assert len(esg) == 0 and esg.peek(5.0) is None


def test_drain_returns_every_request_once() -> None:
    policy = default_registry().create("two_lane_esg")
    reqs = [req(f"r{i}", float(i), 10 * (i + 1), slo_ttft=0.5 + i) for i in range(6)]
    for r in reqs:
        policy.push(r, 3.0)
    assert sorted(r.request_id for r in policy.drain()) == sorted(r.request_id for r in reqs)
    assert len(policy) == 0
