"""Where a ready request goes: the first, program-aware FCFS routing step.

A program keeps its worker while that worker is healthy and has a free slot,
because its KV cache (the prefix of its next prompt) lives there. Otherwise
the least-loaded worker with a free slot takes it. `None` means: keep the
request in the global queue until a slot frees up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    id: str
    inflight: int
    max_batch: int
    kv_used_fraction: float = 0.0

    @property
    def has_slot(self) -> bool:
        return self.inflight < self.max_batch


def choose_worker(workers: Sequence[WorkerLoad], preferred: str | None) -> str | None:
    open_workers = [w for w in workers if w.has_slot]
    if not open_workers:
        return None
    for w in open_workers:
        if w.id == preferred:
            return w.id
    best = min(open_workers, key=lambda w: (w.inflight / w.max_batch, w.kv_used_fraction, w.id))
    return best.id
