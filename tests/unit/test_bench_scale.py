"""bench.scale's reading of the daemon: the scheduling latency it takes from the daemon's
own queue-time histogram (as /metrics renders it), and a process's CPU time."""

from __future__ import annotations

import os
import time

from bench import scale
from daemon.core.exposition import RequestMetrics
from daemon.metrics import DaemonMetrics
from daemon.state import WorkerState


def _worker(worker_id: str) -> WorkerState:
    return WorkerState(id=worker_id, identity=worker_id.encode(), engine="sim", model="m",
                       kv_capacity_tokens=1024, block_size=16, max_batch=8, pid=1, host="h",
                       registered_at=0.0, last_seen=0.0)


def _scrape(metrics: DaemonMetrics) -> dict[float, float]:
    return scale.queue_buckets(metrics.render().decode())


def test_sub_millisecond_waits_are_resolved_and_summed_over_workers() -> None:
    metrics = DaemonMetrics()
    requests = RequestMetrics(metrics)
    before = _scrape(metrics)
    a, b = _worker("a"), _worker("b")
    for _ in range(90):  # 90 waits in (0.1 ms, 0.25 ms], over two workers
        requests.dispatched(a, 0.0002)
        requests.dispatched(b, 0.0002)
    for _ in range(20):  # 20 in (25 ms, 50 ms]
        requests.dispatched(a, 0.03)
    after = _scrape(metrics)
    assert after[float("inf")] == 200
    p50 = scale.histogram_quantile(before, after, 0.5)
    p99 = scale.histogram_quantile(before, after, 0.99)
    assert p50 is not None and 0.0001 < p50 <= 0.00025
    assert p99 is not None and 0.025 < p99 <= 0.05


def test_the_quantile_is_of_what_the_phase_added() -> None:
    metrics = DaemonMetrics()
    requests = RequestMetrics(metrics)
    w = _worker("a")
    for _ in range(1000):  # before the phase: slow waits, which must not count
        requests.dispatched(w, 2.0)
    before = _scrape(metrics)
    for _ in range(10):
        requests.dispatched(w, 0.0007)
    after = _scrape(metrics)
    p99 = scale.histogram_quantile(before, after, 0.99)
    assert p99 is not None and 0.0005 < p99 <= 0.001
    assert scale.histogram_quantile(after, after, 0.5) is None  # nothing in between


def test_cpu_seconds_grows_with_work_done() -> None:
    t0 = scale.cpu_seconds(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert scale.cpu_seconds(os.getpid()) - t0 >= 0.2
