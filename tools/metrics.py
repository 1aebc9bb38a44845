"""Counters and latency histograms the daemon exposes on /metrics (Prometheus layout:
cumulative buckets, a sum and a count), kept here so the manager owns its own numbers."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Preparation spans container start (0.2 to 1 s) to multi-minute setups; execs are mostly short.
BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...] = BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def snapshot(self) -> dict[str, Any]:
        cumulative, running = {}, 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            cumulative[str(bound)] = running
        return {"buckets": cumulative, "sum": self.total, "count": self.n}


@dataclass
class ToolMetrics:
    prepares: Counter[str] = field(default_factory=Counter)  # by outcome reason
    execs: Counter[str] = field(default_factory=Counter)  # by result reason
    releases: Counter[str] = field(default_factory=Counter)  # by resource kind
    prepare_seconds: Histogram = field(default_factory=Histogram)
    exec_seconds: Histogram = field(default_factory=Histogram)
    # How long execs waited for a preparation still in flight: what asynchronous
    # preparation did not manage to hide.
    exec_wait_seconds: Histogram = field(default_factory=Histogram)

    def snapshot(self) -> dict[str, Any]:
        return {
            "prepares_total": dict(self.prepares),
            "execs_total": dict(self.execs),
            "released_total": dict(self.releases),
            "prepare_seconds": self.prepare_seconds.snapshot(),
            "exec_seconds": self.exec_seconds.snapshot(),
            "exec_wait_seconds": self.exec_wait_seconds.snapshot(),
        }
