"""The core's /metrics: per-request histograms and counters under vLLM's names, the
workers' own engine figures, and agentd's program, queue and worker gauges.

vLLM labels its series `model_name` and `engine` (an engine index); agentd keeps
`model_name`, names the worker in `worker` and the engine kind (vllm, sim) in `engine`,
so a dashboard built for vLLM matches ours by model and can split by worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric

from daemon.metrics import (
    INTER_TOKEN_BUCKETS,
    QUEUE_TIME_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    DaemonMetrics,
    counter,
    gauge,
    labelled_counter,
    labelled_gauge,
)
from daemon.state import ProgramState, ProgramStatus, RequestState, WorkerState

WORKER_LABELS = ("model_name", "worker", "engine")
WORKER_HEALTH = ("healthy", "suspect", "unhealthy", "gone")


class EventsWritten(Protocol):
    @property
    def events_written(self) -> int: ...


class Core(Protocol):
    """What of the core its families read."""

    @property
    def workers(self) -> dict[str, WorkerState]: ...
    @property
    def programs(self) -> dict[str, ProgramState]: ...
    @property
    def queue(self) -> Sized: ...
    @property
    def counters(self) -> dict[str, float]: ...
    @property
    def writer(self) -> EventsWritten: ...


def worker_labels(worker: WorkerState) -> tuple[str, str, str]:
    return worker.model, worker.id, worker.engine


class RequestMetrics:
    """What each finished request adds, observed as it happens, labelled by the worker
    that served it (the one that produced its first token, or finished it)."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        r = metrics.registry
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token, from agentd's queue",
            WORKER_LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Time per output token of each request: (end - first token) / (output tokens - 1)",
            WORKER_LABELS, buckets=INTER_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency, from agentd's queue",
            WORKER_LABELS, buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram(
            "agentd_queue_time_seconds", "Time in agentd's global queue before dispatch",
            WORKER_LABELS, buckets=QUEUE_TIME_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of finished requests", WORKER_LABELS,
            registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens of finished requests", WORKER_LABELS,
            registry=r)
        self.cached_tokens = Counter(
            "vllm:prompt_tokens_cached", "Prompt tokens of finished requests served from the "
            "prefix cache", WORKER_LABELS, registry=r)
        self.success = Counter(
            "vllm:request_success", "Finished requests, by finish reason",
            (*WORKER_LABELS, "finished_reason"), registry=r)

    def dispatched(self, worker: WorkerState, queued_s: float) -> None:
        self.queue.labels(*worker_labels(worker)).observe(queued_s)

    def first_token(self, worker: WorkerState, ttft_s: float) -> None:
        self.ttft.labels(*worker_labels(worker)).observe(ttft_s)

    def finished(self, worker: WorkerState, req: RequestState, reason: str, now: float) -> None:
        labels = worker_labels(worker)
        self.e2e.labels(*labels).observe(now - req.queued_at)
        if req.first_token_at is not None and req.output_tokens > 1:
            self.tpot.labels(*labels).observe(
                (now - req.first_token_at) / (req.output_tokens - 1))
        self.prompt_tokens.labels(*labels).inc(req.prompt_tokens)
        self.generation_tokens.labels(*labels).inc(req.output_tokens)
        self.cached_tokens.labels(*labels).inc(req.cached_tokens)
        self.success.labels(*labels, reason).inc()


_ENGINE_GAUGES = (
    ("vllm:num_requests_running", "Requests running on the engine", "running"),
    ("vllm:num_requests_waiting", "Requests waiting in the engine", "waiting"),
)
_ENGINE_COUNTERS = (
    ("vllm:prefix_cache_queries_total", "Prefix cache queries, in tokens",
     "prefix_cache_queries"),
    ("vllm:prefix_cache_hits_total", "Prefix cache hits, in tokens", "prefix_cache_hits"),
    ("vllm:num_preemptions_total", "Preemptions by the engine", "preemptions"),
)


def core_families(core: Core) -> Iterator[Metric]:
    reporting = [w for w in core.workers.values() if w.stats is not None]
    for name, help_text, field in _ENGINE_GAUGES:
        yield labelled_gauge(name, help_text, WORKER_LABELS,
                             [(worker_labels(w), getattr(w.stats, field)) for w in reporting])
    for name, help_text, field in _ENGINE_COUNTERS:
        yield labelled_counter(name, help_text, WORKER_LABELS,
                               [(worker_labels(w), getattr(w.stats, field)) for w in reporting])
    yield labelled_gauge(
        "vllm:kv_cache_usage_perc", "KV cache usage, 0-1", WORKER_LABELS,
        [(worker_labels(w), w.stats.kv_used_tokens / w.stats.kv_capacity_tokens)
         for w in reporting if w.stats is not None and w.stats.kv_capacity_tokens])
    yield counter("agentd_requests_total", "Requests submitted to agentd",
                  core.counters["requests_total"])
    yield counter("agentd_requests_failed_total", "Requests that ended in an error",
                  core.counters["requests_failed"])
    yield counter("agentd_failovers_total", "Requests moved to another worker after theirs "
                  "was lost", core.counters["failovers"])
    yield from _gauges(core)


def _gauges(core: Core) -> Iterator[Metric]:
    counts = dict.fromkeys((s.value for s in ProgramStatus), 0)
    for p in core.programs.values():
        counts[p.status.value] += 1
    yield labelled_gauge("agentd_programs", "Live programs by status", ["status"],
                         [([status], n) for status, n in counts.items()])
    yield labelled_gauge(
        "agentd_workers", "Workers by health", ["status"],
        [([status], sum(w.status == status for w in core.workers.values()))
         for status in WORKER_HEALTH])
    yield gauge("agentd_queue_length", "Requests in the global queue", len(core.queue))
    yield counter("agentd_trace_events_written_total", "Trace events committed to the store",
                  core.writer.events_written)
