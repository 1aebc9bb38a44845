"""The QoS views walk only what their window needs (the short view the newest
completions, the long view in steps) and still give what a full scan of every completion
gives: the reference below is the full scan the views were first written as."""

from __future__ import annotations

import random
import statistics

import pytest

from scheduling.slo import metrics as m
from scheduling.slo.metrics import CompletionRecord
from scheduling.slo.views import LongView, ShortView, ViewBuilder, jain_index, percentile

SHORT_S, LONG_S = 5.0, 60.0


def full_short(done: list[CompletionRecord], views: ViewBuilder, now: float,
               worker: str | None) -> ShortView:
    mine = [r for r in done if r.finish_s >= now - SHORT_S and worker in (None, r.worker)]
    ttfts, tpots = [r.ttft_s for r in mine], [r.tpot_s for r in mine]
    return ShortView(worker, views.short_view(now, worker).queue_len, views.kv_util(now, worker),
                     percentile(ttfts, 50), percentile(ttfts, 99),
                     statistics.fmean(tpots) if tpots else 0.0, percentile(tpots, 99),
                     1.0 - m.slo_attainment(mine), len(mine))


def full_long(done: list[CompletionRecord], arrivals: list[float], now: float) -> LongView:
    w = LONG_S
    mine = [r for r in done if r.finish_s >= now - w]
    half = [r for r in mine if r.finish_s >= now - w / 2]
    older = [r for r in mine if r.finish_s < now - w / 2]
    outputs = [float(r.output_tokens) for r in mine]
    by_tenant: dict[str, list[CompletionRecord]] = {}
    for r in mine:
        by_tenant.setdefault(r.tenant, []).append(r)
    attainment = {t: m.slo_attainment(rs) for t, rs in sorted(by_tenant.items())}
    mean = statistics.fmean(outputs) if outputs else 0.0
    return LongView(
        w, sum(now - w < t <= now for t in arrivals) / w,
        sum(now - 2 * w < t <= now - w for t in arrivals) / w, len(mine),
        statistics.fmean(r.prompt_tokens for r in mine) if mine else 0.0, mean,
        statistics.pstdev(outputs) / mean if len(outputs) > 1 and mean > 0 else 0.0,
        1.0 - m.slo_attainment(mine), 1.0 - m.ttft_compliance(mine),
        1.0 - m.tpot_compliance(mine), m.slo_attainment(older) - m.slo_attainment(half),
        percentile([r.ttft_s for r in mine], 99), m.goodput(mine, w), m.esg_ratio(mine),
        attainment, jain_index(list(attainment.values())))


def record(rng: random.Random, n: int, finish_s: float) -> CompletionRecord:
    out = rng.choice([1, 4, 4, 30, 200])
    return CompletionRecord(f"r{n}", f"t{rng.randrange(4)}", f"w{rng.randrange(3)}",
                            finish_s - 1, finish_s, rng.randrange(10, 900), out,
                            rng.expovariate(2.0), rng.expovariate(30.0), 1.0, 0.05)


def fed(seed: int, n: int, jitter_s: float) -> tuple[ViewBuilder, list[CompletionRecord],
                                                     list[float], float]:
    """A builder fed `n` completions and arrivals over 150 s, each up to `jitter_s` out
    of order; what it was fed (all of it, as a full scan would see it) and the last time."""
    rng = random.Random(seed)
    views = ViewBuilder(SHORT_S, LONG_S)
    done: list[CompletionRecord] = []
    arrivals: list[float] = []
    now = 0.0
    for k in range(n):
        now += rng.expovariate(n / 150.0)
        at = now - rng.uniform(0, jitter_s)
        views.on_arrival(at)
        arrivals.append(at)
        r = record(rng, k, now - rng.uniform(0, jitter_s))
        views.on_completion(r)
        done.append(r)
        if k % 50 == 0:
            views.on_sample(now, f"w{k % 3}", k % 7, rng.random())
    return views, done, arrivals, now


def same_long(a: LongView, b: LongView) -> None:
    """Equal, floats to rounding (sums are taken in another order than the full scan's)."""
    for name in LongView.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, float):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12), name
        elif isinstance(x, dict):
            assert x == pytest.approx(y), name
        else:
            assert x == y, name


@pytest.mark.parametrize(("seed", "jitter_s"), [(1, 0.0), (2, 0.05), (3, 3.0)])
def test_short_view_is_the_full_scan(seed: int, jitter_s: float) -> None:
    views, done, _, now = fed(seed, 4000, jitter_s)
    for at in (now, now + 2.0, now - 1.0, now + 10.0):
        for worker in (None, "w0", "w2", "nobody"):
            assert views.short_view(at, worker) == full_short(done, views, at, worker)


@pytest.mark.parametrize(("seed", "jitter_s"), [(4, 0.0), (5, 0.05), (6, 3.0)])
def test_long_view_is_the_full_scan(seed: int, jitter_s: float) -> None:
    views, done, arrivals, now = fed(seed, 4000, jitter_s)
    for at in (now, now + 7.5, now + 45.0, now + 200.0):
        same_long(views.long_view(at), full_long(done, arrivals, at))


def test_the_stepped_long_view_yields_between_steps_and_ends_with_the_view() -> None:
    views, done, arrivals, now = fed(7, 3000, 0.01)
    steps = views.long_view_steps(now, step=100)
    taken = 0
    while True:
        try:
            next(steps)
            taken += 1
        except StopIteration as end:
            view = end.value
            break
    in_window = sum(1 for r in views._done)
    assert taken == in_window // 100 + 1  # and one before the view is made
    assert view == views.long_view(now)
    same_long(view, full_long(done, arrivals, now))


def test_empty_views_and_a_single_completion() -> None:
    views = ViewBuilder(SHORT_S, LONG_S)
    same_long(views.long_view(10.0), full_long([], [], 10.0))
    assert views.short_view(10.0) == full_short([], views, 10.0, None)
    r = CompletionRecord("a", "t", "w", 8.0, 9.0, 10, 3, 0.2, 0.01, 0.1, 0.05)
    views.on_completion(r)
    views.on_arrival(8.0)
    same_long(views.long_view(10.0), full_long([r], [8.0], 10.0))
    assert views.short_view(10.0) == full_short([r], views, 10.0, None)


def test_late_events_are_kept_in_order_and_the_oldest_leave_first() -> None:
    views = ViewBuilder(SHORT_S, 10.0)
    rng = random.Random(9)
    for k, at in enumerate([5.0, 3.0, 4.0, 12.0, 11.0, 16.5]):
        views.on_completion(record(rng, k, at))
        views.on_arrival(at)
    assert [r.finish_s for r in views._done] == [11.0, 12.0, 16.5]
    assert list(views._arrivals) == [3.0, 4.0, 5.0, 11.0, 12.0, 16.5]
