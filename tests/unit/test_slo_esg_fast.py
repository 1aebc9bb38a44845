"""ESG density with a fast gate (``esg_fast``), the full stack's initial policy (issue 5)."""

from __future__ import annotations

import random

import pytest

from scheduling.slo.ordering import EsgDensity, EsgFastGate, RequestQueue, default_registry, switch
from scheduling.slo.prediction import QueuedRequest
from scheduling.slo.templates import Slo, TaskType


def req(rid: str, arrival: float = 0.0, l_pred: int = 100, slo_ttft: float = 5.0,
        prompt: int = 10) -> QueuedRequest:
    # T_tot = 0.1 + 0.01 * l_pred; V_base = prompt + 2 * l_pred.
    return QueuedRequest(request_id=rid, tenant="a", arrival_s=arrival, prompt_tokens=prompt,
                         task=TaskType.QA, importance=0.75, slo=Slo(slo_ttft, 0.05),
                         l_pred=l_pred, l_upper=2 * l_pred, ttft_pred_s=0.1, tpot_pred_s=0.01)


def ids(policy: EsgFastGate | EsgDensity, now: float) -> list[str]:
    return [policy.pop(now).request_id for _ in range(len(policy))]


def test_every_other_pop_is_the_shortest_request_still_on_time() -> None:
    """ESG density alone serves the big requests first; the gate interleaves the shortest
    one that can meet its TTFT, which density would leave for last."""
    reqs = [req("big1", l_pred=900), req("big2", l_pred=800), req("big3", l_pred=700),
            req("small", l_pred=5), req("mid", l_pred=50)]
    gated, density = EsgFastGate(), EsgDensity()
    for r in reqs:
        gated.push(r, 0.0)
        density.push(r, 0.0)
    assert ids(density, 0.0) == ["big1", "big2", "big3", "mid", "small"]
    assert ids(gated, 0.0) == ["big1", "small", "big2", "mid", "big3"]


def test_the_gate_skips_requests_past_their_ttft() -> None:
    """At 3 s the short request cannot meet its 1 s TTFT any more: the gate's turn goes
    to the shortest one that still can, and the lost one waits its ESG turn."""
    gated = EsgFastGate()
    for r in (req("big", 0.0, l_pred=900, slo_ttft=10.0), req("lost", 0.0, l_pred=5, slo_ttft=1.0),
              req("ok", 0.0, l_pred=60, slo_ttft=10.0)):
        gated.push(r, 0.0)
    assert gated.pop(3.0).request_id == "big"
    head = gated.peek(3.0)
    assert head is not None and head.request_id == "ok"
    assert ids(gated, 3.0) == ["ok", "lost"]


def test_with_nothing_on_time_it_is_esg_density() -> None:
    rng = random.Random(5)
    reqs = [req(f"r{i}", rng.uniform(0, 2), rng.randint(1, 900), slo_ttft=0.5,
                prompt=rng.randint(1, 4000)) for i in range(40)]
    gated, density = EsgFastGate(), EsgDensity()
    for r in reqs:
        gated.push(r, 10.0)
        density.push(r, 10.0)
    assert ids(gated, 10.0) == ids(density, 10.0)


def test_peek_is_what_pop_returns_and_every_request_comes_out_once() -> None:
    rng = random.Random(11)
    gated, now, pushed, popped = EsgFastGate(refresh_s=0.5), 0.0, [], []
    for i in range(300):
        now += rng.expovariate(5.0)
        r = req(f"r{i}", now, rng.randint(1, 600), slo_ttft=rng.choice((0.3, 2.0, 8.0)))
        gated.push(r, now)
        pushed.append(r.request_id)
        if rng.random() < 0.6:
            head = gated.peek(now)
            out = gated.pop(now)
            assert head is out
            popped.append(out.request_id)
    popped += ids(gated, now)
    assert sorted(popped) == sorted(pushed)
    assert len(gated) == 0 and gated.peek(now) is None
    with pytest.raises(IndexError):
        gated.pop(now)


def test_switching_in_and_out_keeps_the_multiset() -> None:
    """A switch drains the stale entries too: no request is lost or duplicated."""
    queue = RequestQueue(default_registry().create("two_lane_esg"))
    reqs = [req(f"r{i}", i * 0.1, 10 * (i + 1), slo_ttft=0.5 + i % 3) for i in range(12)]
    for r in reqs:
        queue.push(r, 1.0)
    switch(queue, default_registry().create("esg_fast"), 1.0)
    assert isinstance(queue.policy, EsgFastGate)
    taken = [queue.pop(1.5).request_id for _ in range(5)]  # both heaps now hold stale entries
    switch(queue, default_registry().create("fcfs"), 2.0)
    rest = [queue.pop(2.0).request_id for _ in range(len(queue))]
    assert sorted(taken + rest) == sorted(r.request_id for r in reqs)
    assert len(set(taken + rest)) == len(reqs)
