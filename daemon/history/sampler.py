"""One sample of the daemon's own series per interval. Pure: the service feeds it the
requests that ended, the counters and the gauges, with the time.

Rates are over the interval since the previous sample (so a sample taken late still
means per second); latency percentiles are over the requests that ended in it, and a
series with nothing to say in an interval (no request ended) gets no point rather than
a made-up zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from daemon.history.tiers import MAX, MEAN, Point

# Every series the sampler writes, what it means, and how its rollups fold.
SERIES: dict[str, tuple[str, str]] = {
    "requests_per_s": ("requests that finished, per second", MEAN),
    "tokens_per_s": ("output tokens generated, per second", MEAN),
    "goodput_per_s": ("requests that finished within both SLOs of their task, per second",
                      MEAN),
    "failed_per_s": ("requests that failed, per second", MEAN),
    "refused_per_s": ("requests the admission fence refused (first refusal), per second",
                      MEAN),
    "http_5xx_per_s": ("API answers with a 5xx status (503: no worker, draining, store "
                       "down), per second", MEAN),
    "ttft_p50_s": ("time to first token, median over the interval", MAX),
    "ttft_p95_s": ("time to first token, 95th percentile over the interval", MAX),
    "ttft_p99_s": ("time to first token, 99th percentile over the interval", MAX),
    "tpot_p50_s": ("time per output token after the first, median", MAX),
    "tpot_p95_s": ("time per output token after the first, 95th percentile", MAX),
    "tpot_p99_s": ("time per output token after the first, 99th percentile", MAX),
    "kv_used_pct": ("KV cache used, percent, per worker (label)", MEAN),
    "queue_length": ("requests in the global waiting queue", MEAN),
    "paused_programs": ("programs PAUSED (KV evicted, waiting to be restored)", MEAN),
    "pauses_per_s": ("programs the KV policy paused, per second", MEAN),
    "healthy_workers": ("workers that are healthy", MEAN),
}
FOLD = {name: how for name, (_, how) in SERIES.items()}
PERCENTILES = (50, 95, 99)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (a value that occurred, as an operator expects)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Ended:
    """A request that ended, as the sampler needs it."""

    finished: bool  # False: failed (aborted requests count as neither)
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None


@dataclass(frozen=True, slots=True)
class Gauges:
    """What is true at the sample's time, and the daemon's cumulative counters."""

    kv_used_pct: Mapping[str, float]  # per worker
    queue_length: int
    paused_programs: int
    healthy_workers: int
    good_total: int  # the SLO stack's count of requests within both SLOs
    refused_total: int  # ... and of admission refusals
    http_5xx_total: int
    pauses_total: int = 0  # the KV policy's pauses


@dataclass
class IntervalStats:
    """What happened since the last sample."""

    started: float
    ended: list[Ended] = field(default_factory=list)
    last: Gauges | None = None  # the previous sample's counters

    def on_end(self, e: Ended) -> None:
        self.ended.append(e)

    def take(self, now: float, g: Gauges) -> list[Point]:
        """The interval's points; the next interval starts now."""
        span = max(now - self.started, 1e-6)
        finished = [e for e in self.ended if e.finished]
        points = [
            Point("requests_per_s", "", now, len(finished) / span),
            Point("tokens_per_s", "", now, sum(e.output_tokens for e in finished) / span),
            Point("failed_per_s", "", now, sum(not e.finished for e in self.ended) / span),
            Point("queue_length", "", now, float(g.queue_length)),
            Point("paused_programs", "", now, float(g.paused_programs)),
            Point("healthy_workers", "", now, float(g.healthy_workers)),
        ]
        points += [Point("kv_used_pct", w, now, pct) for w, pct in sorted(g.kv_used_pct.items())]
        if self.last is not None:  # counters: a rate needs the previous value
            points += [
                Point("goodput_per_s", "", now, _delta(self.last.good_total, g.good_total) / span),
                Point("refused_per_s", "", now,
                      _delta(self.last.refused_total, g.refused_total) / span),
                Point("http_5xx_per_s", "", now,
                      _delta(self.last.http_5xx_total, g.http_5xx_total) / span),
                Point("pauses_per_s", "", now,
                      _delta(self.last.pauses_total, g.pauses_total) / span),
            ]
        points += _percentiles("ttft", now, (e.ttft_s for e in finished))
        points += _percentiles("tpot", now, (e.tpot_s for e in finished))
        self.started, self.ended, self.last = now, [], g
        return points


def _delta(before: int, after: int) -> int:
    return max(after - before, 0)  # a counter that went down was reset: no negative rate


def _percentiles(name: str, now: float, values: Iterable[float | None]) -> list[Point]:
    known = [v for v in values if v is not None]
    if not known:
        return []
    return [Point(f"{name}_p{q}_s", "", now, percentile(known, q)) for q in PERCENTILES]
