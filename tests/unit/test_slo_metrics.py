"""SLO metrics on hand-computed examples, and the short/long view builders."""

from __future__ import annotations

import pytest

from scheduling.slo import metrics as m
from scheduling.slo.metrics import CompletionRecord
from scheduling.slo.views import ViewBuilder, jain_index, percentile


def rec(
    rid: str = "r",
    *,
    tenant: str = "a",
    worker: str = "w0",
    finish: float = 10.0,
    prompt: int = 100,
    out: int = 50,
    ttft: float = 1.0,
    tpot: float = 0.1,
    slo_ttft: float = 2.0,
    slo_tpot: float = 0.05,
) -> CompletionRecord:
    return CompletionRecord(
        rid, tenant, worker, finish - 5.0, finish, prompt, out, ttft, tpot, slo_ttft, slo_tpot
    )


LATE = rec("late")  # TTFT ok, TPOT 0.1 > 0.05
ON_TIME = rec("ok", prompt=10, out=20, ttft=0.5, tpot=0.05, slo_ttft=1.0, slo_tpot=0.1)


def test_compliance_attainment_and_goodput() -> None:
    records = [LATE, ON_TIME]
    assert (LATE.ttft_ok, LATE.tpot_ok, LATE.ok, ON_TIME.ok) == (True, False, False, True)
    assert m.ttft_compliance(records) == 1.0
    assert m.tpot_compliance(records) == 0.5
    assert m.slo_attainment(records) == 0.5
    assert m.goodput(records, window_s=10.0) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        m.goodput(records, 0.0)


def test_esg_by_hand() -> None:
    # LATE: TTLT = 1 + 50*0.1 = 6, SLO_ttlt = 2 + 50*0.05 = 4.5, gain 0.75, V = 100 + 2*50 = 200.
    # ON_TIME: TTLT = 0.5 + 1 = 1.5 <= SLO_ttlt = 1 + 2 = 3, gain 1, V = 10 + 2*20 = 50.
    assert LATE.ttlt_s == pytest.approx(6.0) and LATE.slo_ttlt_s == pytest.approx(4.5)
    assert m.service_gain(LATE) == pytest.approx(0.75)
    assert m.esg([LATE, ON_TIME]) == pytest.approx(150.0 + 50.0)
    assert m.esg_ratio([LATE, ON_TIME]) == pytest.approx(200.0 / 250.0)
    assert m.esg([LATE], alpha=2.0) == pytest.approx(200 * 0.75**2)
    assert m.esg([]) == 0.0 and m.esg_ratio([]) == 1.0


def test_percentile_and_jain() -> None:
    assert percentile([], 99) == 0.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_short_view_per_worker_and_global_over_its_window() -> None:
    vb = ViewBuilder(short_window_s=5.0, long_window_s=60.0)
    vb.on_sample(0.0, "w0", 99, 1.0)  # falls out of the window by t = 10
    vb.on_sample(8.0, "w0", 4, 0.5)
    vb.on_sample(9.0, "w0", 6, 0.7)
    vb.on_sample(9.0, "w1", 2, 0.3)
    vb.on_completion(rec("old", finish=2.0, ttft=9.0))
    vb.on_completion(rec("x", worker="w0", finish=9.0, ttft=1.0, tpot=0.01))
    vb.on_completion(rec("y", worker="w1", finish=9.5, ttft=3.0, tpot=0.01))
    w0 = vb.short_view(10.0, "w0")
    assert (w0.queue_len, w0.completions) == (6, 1)
    assert w0.kv_util == pytest.approx(0.6)
    assert w0.ttft_p99_s == 1.0 and w0.violation_rate == 0.0
    everything = vb.short_view(10.0)
    assert everything.queue_len == 8 and everything.completions == 2
    assert everything.kv_util == pytest.approx(0.5)
    assert everything.ttft_p99_s == 3.0 and everything.violation_rate == 0.5


def test_long_view_rates_mix_trend_and_fairness() -> None:
    vb = ViewBuilder(short_window_s=5.0, long_window_s=10.0)
    for t in range(0, 10):
        vb.on_arrival(t + 0.5)  # previous window (0, 10]: 1/s
    for t in range(10, 20):
        vb.on_arrival(t + 0.25)
        vb.on_arrival(t + 0.75)  # current window (10, 20]: 2/s
    # Older half all on time; newer half: tenant b misses every SLO.
    for i in range(4):
        vb.on_completion(rec(f"a{i}", tenant="a", finish=11.0 + i, out=10, tpot=0.01))
        vb.on_completion(rec(f"b{i}", tenant="b", finish=16.0 + i, out=90, ttft=5.0, tpot=0.01))
    v = vb.long_view(20.0)
    assert v.arrival_rate == pytest.approx(2.0) and v.prev_arrival_rate == pytest.approx(1.0)
    assert v.completions == 8
    assert v.output_len_mean == pytest.approx(50.0)
    assert v.output_len_cv == pytest.approx(0.8)
    assert v.violation_rate == 0.5 and v.ttft_violation_rate == 0.5 and v.tpot_violation_rate == 0
    assert v.violation_trend == pytest.approx(1.0)
    assert dict(v.tenant_attainment) == {"a": 1.0, "b": 0.0}
    assert v.fairness == pytest.approx(0.5)
    assert v.goodput == pytest.approx(0.4)
