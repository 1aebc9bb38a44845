"""Cluster throughput and goodput over time, from successive polls of the daemon's counters.

Goodput is the daemon's own figure: requests that met both the TTFT and the TPOT SLO of
their task (GET /v1/scheduling `counters.met`, judged by the daemon's SLO stack), per
second between two polls. The daemon's long-window goodput and attainment come along
for the title. Nothing here judges a request against an SLO itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from console.tui.data import Snapshot

HISTORY = 120
GENERATED = "vllm:generation_tokens_total"  # summed over workers (metric_sums)


def slo_met(snap: Snapshot) -> float:
    return float((snap.slo.get("counters") or {}).get("met", 0))


@dataclass
class Rates:
    """Per-poll rates: generated tokens/s, and requests/s that met their SLOs."""

    size: int = HISTORY
    throughput: deque[float] = field(init=False)
    goodput: deque[float] = field(init=False)
    window: dict[str, Any] = field(default_factory=dict)  # the daemon's, as last polled
    _last: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        self.throughput = deque(maxlen=self.size)
        self.goodput = deque(maxlen=self.size)

    def add(self, snap: Snapshot) -> None:
        """Fold in one poll; polls without time passing (or a daemon restart) add nothing."""
        self.window = dict(snap.slo.get("window") or {})
        point = (snap.taken_at, snap.metrics.get(GENERATED, 0.0), slo_met(snap))
        last = self._last
        if last is not None and point[0] <= last[0]:
            return
        self._last = point
        if last is None or point[1] < last[1] or point[2] < last[2]:
            return  # the first poll, or counters went back: the daemon restarted
        dt = point[0] - last[0]
        self.throughput.append((point[1] - last[1]) / dt)
        self.goodput.append((point[2] - last[2]) / dt)
