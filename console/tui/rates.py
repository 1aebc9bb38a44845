"""Cluster throughput and goodput over time, from successive polls of /metrics counters.

Goodput counts the requests whose time to first token met the operator's TTFT SLO
(`--ttft-slo`), read from the daemon's TTFT histogram: the SLO is rounded down to a
bucket bound, since the histogram cannot say more.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from console.tui.data import Snapshot

HISTORY = 120
GENERATED = "vllm:generation_tokens"


def slo_bucket(bounds: list[float], slo_s: float) -> float | None:
    """The largest histogram bound at or under the SLO; None when all are above it."""
    ordered = sorted(b for b in bounds if b != float("inf"))
    i = bisect.bisect_right(ordered, slo_s)
    return ordered[i - 1] if i else None


@dataclass
class Rates:
    """Per-poll rates: generated tokens/s and requests/s within the TTFT SLO."""

    ttft_slo_s: float
    size: int = HISTORY
    throughput: deque[float] = field(init=False)
    goodput: deque[float] = field(init=False)
    bucket: float | None = None
    _last: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        self.throughput = deque(maxlen=self.size)
        self.goodput = deque(maxlen=self.size)

    def add(self, snap: Snapshot) -> None:
        """Fold in one poll; polls without time passing (or a daemon restart) add nothing."""
        self.bucket = slo_bucket(list(snap.ttft_buckets), self.ttft_slo_s)
        good = snap.ttft_buckets.get(self.bucket, 0.0) if self.bucket is not None else 0.0
        point = (snap.taken_at, snap.metrics.get(GENERATED, 0.0), good)
        last = self._last
        if last is not None and point[0] <= last[0]:
            return
        self._last = point
        if last is None or point[1] < last[1] or point[2] < last[2]:
            return  # the first poll, or counters went back: the daemon restarted
        dt = point[0] - last[0]
        self.throughput.append((point[1] - last[1]) / dt)
        self.goodput.append((point[2] - last[2]) / dt)
