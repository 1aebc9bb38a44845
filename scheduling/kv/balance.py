"""Request rebalancing: where the ready request of an admitted, acting program runs."""

from __future__ import annotations

from collections.abc import Callable

from scheduling.kv.view import KvView, ProgramView


def used_fraction(view: KvView, worker_id: str) -> float:
    worker = view.worker(worker_id)
    return 0.0 if worker is None else worker.used_tokens / max(worker.capacity_tokens, 1)


def rebalance(view: KvView, program: ProgramView, threshold: float,
              fits: Callable[[str], bool]) -> str | None:
    """The program's own worker, unless its KV use with this request would exceed
    the least-used healthy worker's by more than `threshold`, moving narrows the
    gap, and the request `fits` there: then that worker (the request recomputes
    whatever of its context that worker does not cache)."""
    home = view.home_worker(program)
    if home is None:
        return None
    others = [w.worker_id for w in view.healthy_workers() if w.worker_id != home]
    if not others:
        return home
    target = min(others, key=lambda w: (used_fraction(view, w), w))
    worker = view.worker(home)
    assert worker is not None
    share = program.context_tokens / max(worker.capacity_tokens, 1)
    gap = used_fraction(view, home) + share - used_fraction(view, target)
    narrows = used_fraction(view, target) + share < used_fraction(view, home)
    if gap <= threshold or not narrows or not fits(target):
        return home
    return target
