"""/metrics through prometheus_client: one registry per daemon, parts add their collectors.

Each daemon (a test may run two in one process) owns a `DaemonMetrics`; a part that has
numbers to show adds a function yielding metric families (prometheus_client's custom
collector interface) or registers prometheus_client Histogram/Counter objects in its
`registry`. Nothing here is module-global, and the text format is prometheus_client's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# What generate_latest writes (and every Prometheus reads): the classic text format.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# vLLM's own buckets (vllm/v1/metrics/buckets.py), so dashboards built for vLLM read ours.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
INTER_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# A request's wait in agentd's queue is sub-millisecond when a worker has room (the control
# plane's own scheduling latency, bench/scale.py reads its p50/p99) and seconds to minutes
# when the KV policy holds it: fine buckets at the bottom, the request buckets above.
QUEUE_TIME_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    *REQUEST_LATENCY_BUCKETS[1:],
)

Families = Callable[[], Iterable[Metric]]


class FunctionCollector(Collector):
    """A function yielding metric families, as a prometheus_client collector."""

    def __init__(self, collect: Families) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class DaemonMetrics:
    """One daemon's registry: what its /metrics serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def add(self, collect: Families) -> Callable[[], None]:
        """Have `collect()`'s families on every scrape; returns the remover."""
        collector = FunctionCollector(collect)
        self.registry.register(collector)

        def remove() -> None:
            with contextlib.suppress(KeyError):  # removed already
                self.registry.unregister(collector)

        return remove

    def render(self) -> bytes:
        return generate_latest(self.registry)


# --- building families ----------------------------------------------------------------
# prometheus_client's family classes take a counter's name without `_total` and add it to
# the sample; these helpers take the name as scraped, so a grep for it finds the code.


def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(_counter_name(name), help_text, value=value)


def labelled_gauge(name: str, help_text: str, labels: Sequence[str],
                   rows: Iterable[tuple[Sequence[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def labelled_counter(name: str, help_text: str, labels: Sequence[str],
                     rows: Iterable[tuple[Sequence[str], float]]) -> CounterMetricFamily:
    family = CounterMetricFamily(_counter_name(name), help_text, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def histogram(name: str, help_text: str, cumulative: Mapping[str, float],
              sum_value: float) -> HistogramMetricFamily:
    """`cumulative`: upper bound ("+Inf" last) -> observations at or below it."""
    return HistogramMetricFamily(name, help_text, buckets=list(cumulative.items()),
                                 sum_value=sum_value)


def _counter_name(name: str) -> str:
    if not name.endswith("_total"):
        raise ValueError(f"counter {name} must end in _total")
    return name.removesuffix("_total")
