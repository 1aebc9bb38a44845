"""Prometheus text exposition without a client library: a few gauges, counters, histograms."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

# vLLM's own TTFT / e2e buckets (seconds), so dashboards built for vLLM read ours.
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> Iterable[str]:
        sep = "," if labels else ""
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            yield f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}'
        yield f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}'
        suffix = f"{{{labels}}}" if labels else ""
        yield f"{name}_sum{suffix} {self.total}"
        yield f"{name}_count{suffix} {self.n}"


Collector = Callable[["Exposition"], None]
_COLLECTORS: list[Collector] = []


def add_collector(collect: Collector) -> Callable[[], None]:
    """Have `collect(out)` add its families to every /metrics page (as prometheus_client's
    registry does), so a part of the daemon owns its metrics; returns the remover."""
    _COLLECTORS.append(collect)

    def remove() -> None:
        if collect in _COLLECTORS:
            _COLLECTORS.remove(collect)

    return remove


class Exposition:
    """Collects metric families in order and renders them once, registered collectors last."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: str) -> None:
        if labels:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            self._lines.append(f"{name}{{{inner}}} {value}")
        else:
            self._lines.append(f"{name} {value}")

    def histogram(self, name: str, help_text: str, hist: Histogram) -> None:
        self.family(name, "histogram", help_text)
        self._lines.extend(hist.lines(name))

    def render(self) -> str:
        for collect in list(_COLLECTORS):
            collect(self)
        return "\n".join(self._lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
