"""Release on demand: a waiting program that fits nowhere takes the room of acting
programs past their hold window, paused longest acting first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduling.kv.plan import Plan
from scheduling.kv.view import ProgramStatus, ProgramView


def releasable(plan: Plan, worker_id: str, held: Callable[[ProgramView], bool]
               ) -> list[ProgramView]:
    """ACTING programs on `worker_id` past their hold, longest acting first: vLLM's LRU
    frees the oldest blocks first, so they have the least cache left to lose."""
    out = [v for v in plan.victims(worker_id)
           if v.status is ProgramStatus.ACTING and not held(v)]
    return sorted(out, key=lambda v: (v.acting_since or 0.0, v.program_id))


def make_room(plan: Plan, program: ProgramView, held: Callable[[ProgramView], bool],
              score: Callable[[str], Any], watermark: float | None = None) -> str | None:
    """Pause releasable programs on the best-scoring (lowest) worker where that makes
    `program` fit now under capacity times `watermark` (default: the low watermark),
    and return that worker; None (and no pause) if none can. Workers that already
    have the room are skipped."""
    low = plan.view.config.low_watermark if watermark is None else watermark
    best: tuple[Any, str, list[ProgramView]] | None = None
    for worker_id in plan.ledger.worker_ids():
        if worker_id in plan.reserved or not plan.ledger.is_healthy(worker_id):
            continue
        room, cost = plan.ledger.room_now(worker_id, low), plan.ledger.cost(worker_id, program)
        if room >= cost:
            continue  # it has room: the policy kept the program off it for another reason
        victims = releasable(plan, worker_id, held)
        if room + sum(plan.ledger.booked(v.program_id) for v in victims) < cost:
            continue
        key = score(worker_id)
        if best is None or key < best[0]:
            best = (key, worker_id, victims)
    if best is None:
        return None
    _, worker_id, victims = best
    for victim in victims:
        if plan.ledger.room_now(worker_id, low) >= plan.ledger.cost(worker_id, program):
            break
        plan.evict(victim, "released")
    return worker_id
