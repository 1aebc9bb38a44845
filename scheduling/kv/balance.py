"""Request rebalancing: where the ready request of an admitted, acting program runs."""

from __future__ import annotations

from collections.abc import Callable

from scheduling.kv.ledger import Ledger
from scheduling.kv.view import KvView, ProgramView


def used_fraction(view: KvView, worker_id: str) -> float:
    worker = view.worker(worker_id)
    return 0.0 if worker is None else worker.used_tokens / max(worker.capacity_tokens, 1)


def rebalance(view: KvView, program: ProgramView, threshold: float,
              fits: Callable[[str], bool]) -> str | None:
    """The program's own worker, unless its KV use exceeds the least-used healthy
    worker's by more than `threshold` before this request, moving narrows the gap
    (the gap is wider than the request's context), and the request `fits` there:
    then that worker (the request recomputes whatever of its context that worker
    does not cache).

    The gap is taken before the request, not after: then a long context, whose move
    recomputes the most, is not moved on a narrower gap than a short one."""
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
    gap = used_fraction(view, home) - used_fraction(view, target)
    if gap <= max(threshold, share) or not fits(target):
        return home
    return target


def lasting_gap(ledger: Ledger, home: str, target: str) -> float:
    """How much more KV, as a share of `home`'s capacity, the programs admitted to `home`
    hold than those admitted to `target` (the ledger counts acting programs too).

    Usage counts only running requests, so with a few programs per worker it swings by
    whole contexts as requests start and end; admitted demand moves only when programs
    are placed, paused or grow. A gap in usage that admitted demand does not show
    closes by itself once the requests end."""
    return (ledger.demand(home) - ledger.demand(target)) / max(ledger.limit(home, 1.0), 1.0)
