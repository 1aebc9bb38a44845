"""Whether a paused program's blocks are still cached on its worker, as the daemon knows it.

From the engine itself where it publishes KV cache events (vLLM with `KVEventsConfig`, the
sim engine): its worker mirrors the cache from them and reports, per program, how many
leading tokens of the program's last context are still cached (daemon/engines/kv_events.py,
carried by heartbeats into `WorkerState.residency`). A program is resident when all but at
most one block of that context is cached, in the engine's cache or a lower tier it restores
from (vLLM's CPU offloading): the block holding the last token may never be cached.

For an engine without events, and for a program its worker has not reported since its last
request ended, the count-based estimate (scheduling/kv/residency.py) answers instead: the
labelled fallback, `source` "estimate". `kv_residency = "estimate"` in the config uses the
estimate everywhere, as an ablation of the events.
"""

from __future__ import annotations

from collections.abc import Mapping

from daemon.state import RequestState, WorkerState
from scheduling.kv.residency import ResidencyEstimator, held_tokens

RESIDENCY_SOURCES = ("events", "estimate")


class KvResidency:
    def __init__(self, source: str = "events") -> None:
        if source not in RESIDENCY_SOURCES:
            raise ValueError(f"kv_residency must be one of {', '.join(RESIDENCY_SOURCES)}, "
                             f"got {source!r}")
        self.use_events = source == "events"
        self.estimator = ResidencyEstimator()

    def source(self, worker: WorkerState) -> str:
        """Where the residency of the worker's programs comes from."""
        return "events" if self.use_events and worker.kv_events else "estimate"

    def of(self, program_id: str, worker: WorkerState) -> tuple[bool | None, int | None]:
        """(resident, cached tokens) of the program's blocks on `worker`; cached tokens
        only when the engine's events say."""
        if self.use_events and worker.kv_events:
            report = worker.residency.get(program_id)
            if report is not None:
                # Blocks in a lower tier (host memory) come back without recompute, at a
                # transfer some 30x cheaper than their prefill: counted as cached.
                cached = report.reachable_tokens
                return cached >= report.context_tokens - worker.block_size, cached
        used = worker.stats.kv_used_tokens if worker.stats else None
        return self.estimator.resident(program_id, worker.id, used), None

    def request_hit(self, req: RequestState) -> None:
        """The engine reported the request's cached tokens: blocks it took out of the
        free queue without evicting anything."""
        if req.worker_id is not None:
            self.estimator.request_hit(req.program_id, req.worker_id, req.cached_tokens)

    def request_ended(self, req: RequestState, worker: WorkerState) -> None:
        """A request that ran on `worker` ended and freed its blocks there."""
        # Its worker's report of the program is about the context before this request:
        # until the next heartbeat reports the new one, the estimate answers.
        worker.residency.pop(req.program_id, None)
        if worker.stats is None:
            return
        # The worker's last stats were taken while it ran: their usage still counts it.
        own = held_tokens(req.prompt_tokens, req.output_tokens, worker.block_size)
        self.estimator.request_ended(
            req.program_id, worker.id, req.prompt_tokens, req.cached_tokens, req.output_tokens,
            worker.stats.kv_used_tokens - own, worker.kv_capacity_tokens, worker.block_size)

    def worker_reset(self, worker_id: str) -> None:
        """The worker registered again: its cache is empty (and its reports start anew)."""
        self.estimator.worker_reset(worker_id)

    def forget_except(self, programs: Mapping[str, object],
                      workers: Mapping[str, WorkerState]) -> None:
        self.estimator.forget_except(programs)
        for worker in workers.values():
            for pid in [pid for pid in worker.residency if pid not in programs]:
                del worker.residency[pid]
