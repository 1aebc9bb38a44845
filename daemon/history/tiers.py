"""Retention and downsampling tiers, and how a read picks one. Pure: times are given.

Raw samples (`step_s` 0) are kept `history_raw_keep_s`; each coarser tier folds the tier
below it into buckets of its step and keeps them its own time. A bucket is folded once,
when it is complete, so a rollup never changes after it is written; the newest rollup of
a tier is its watermark (db/history_store.py reads it back after a restart).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# How the values of one series fold into a bucket. Rates and gauges average (weighted by
# the raw samples each value holds); a percentile keeps the worst value of the bucket, an
# upper bound of the bucket's true percentile, for an average of p99s hides the spike an
# operator looks for.
MEAN, MAX = "mean", "max"
SPAN_GRACE_S = 60.0


@dataclass(frozen=True, slots=True)
class Tier:
    step_s: int  # 0: raw samples
    keep_s: float


@dataclass(frozen=True, slots=True)
class Point:
    series: str
    label: str
    ts: float
    value: float
    samples: int = 1


def tiers_of(raw_keep_s: float, minute_keep_s: float, ten_minute_keep_s: float
             ) -> tuple[Tier, ...]:
    return (Tier(0, raw_keep_s), Tier(60, minute_keep_s), Tier(600, ten_minute_keep_s))


def due_buckets(step_s: int, watermark: float | None, oldest: float | None,
                now: float) -> tuple[float, float] | None:
    """The span [start, end) of complete buckets of `step_s` not folded yet: from the
    watermark (the end of the last folded bucket) or the oldest finer point, to the
    start of the bucket `now` is in. None when no bucket is complete."""
    start = watermark if watermark is not None else oldest
    if start is None:
        return None
    start = start - start % step_s
    end = now - now % step_s
    return (start, end) if end > start else None


def fold(points: Iterable[Point], step_s: int, how: dict[str, str]) -> list[Point]:
    """The points folded into one point per series, label and bucket of `step_s`, each
    stamped with its bucket's start; `how[series]` is MEAN (default) or MAX."""
    acc: dict[tuple[str, str, float], tuple[float, int]] = {}
    for p in points:
        key = (p.series, p.label, p.ts - p.ts % step_s)
        total, n = acc.get(key, (0.0 if how.get(p.series, MEAN) == MEAN else p.value, 0))
        if how.get(p.series, MEAN) == MAX:
            acc[key] = (max(total, p.value), n + p.samples)
        else:
            acc[key] = (total + p.value * p.samples, n + p.samples)
    out = []
    for (series, label, ts), (total, n) in sorted(acc.items(), key=lambda kv: kv[0][2]):
        value = total if how.get(series, MEAN) == MAX else total / max(n, 1)
        out.append(Point(series, label, ts, value, n))
    return out


def pick_tier(tiers: tuple[Tier, ...], since: float, step_s: float, now: float) -> Tier:
    """Of the tiers that still hold `since`, the coarsest no coarser than `step_s` (or
    the finest, when all are coarser); the coarsest tier when none holds it (what is
    older is gone)."""
    # a span of just the retention (the last day, asked a moment ago) counts as held
    holding = [t for t in tiers if now - since <= t.keep_s + SPAN_GRACE_S]
    if not holding:
        return max(tiers, key=lambda t: t.step_s)
    fine_enough = [t for t in holding if t.step_s <= step_s]
    if fine_enough:
        return max(fine_enough, key=lambda t: t.step_s)
    return min(holding, key=lambda t: t.step_s)


def auto_step(since: float, until: float, points: int = 300) -> float:
    """A step that shows the span in about `points` points."""
    return max((until - since) / points, 1.0)
