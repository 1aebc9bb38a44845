"""ThunderAgent's program-aware KV policy (periodic thrashing check, shortest-first
pause and restore, one global waiting queue across workers)."""

from __future__ import annotations

from typing import Any

from scheduling.kv.decisions import Decision, placements
from scheduling.kv.ledger import Ledger, decay
from scheduling.kv.plan import Plan, pause_order, restore_order
from scheduling.kv.policy import KvPolicy
from scheduling.kv.view import RESIDENT, KvView, ProgramStatus, ProgramView

_QUEUE = (ProgramStatus.QUEUED, ProgramStatus.PAUSED)


class ThunderAgentPolicy(KvPolicy):
    """Each step, per worker:

    1. thrashing check: Σ tokens(REASONING) + Σ f(t_acting)·tokens(ACTING) against
       capacity · high watermark, f(t) = exp(-λt); over it, pause ACTING programs
       shortest first, then mark REASONING ones (paused when their request ends);
    2. force-resume: a request waiting longer than `force_resume_s` is placed on the
       worker with most room, evicting there if needed, so nothing waits forever;
    3. restore from the global queue, in `restore_order`, onto the worker the
       program last ran on if it has room, else the best fit (smallest non-negative
       room left) under the low watermark. Restore is node-agnostic: a paused
       program's KV is assumed gone, so moving it costs no more than staying.

    Pinned programs are never paused. Subclasses change one piece by overriding
    `weight`, `pause_key`, `share_prefix`, `choose_worker` or `fits`.
    """

    name = "thunderagent"
    share_prefix = False

    def decide(self, view: KvView, now: float) -> list[Decision]:
        plan = self._plan(view, now)
        self._relieve(plan)
        self._force_resume(plan, now)
        self._restore(plan)
        return plan.decisions

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        program = view.program(program_id)
        if program.status in RESIDENT:
            return view.home_worker(program)
        if not program.waiting:
            return None
        # Placing only (no pauses): route must not rely on evictions not yet applied.
        plan = self._plan(view, now)
        self._restore(plan, until=program_id)
        return placements(plan.decisions).get(program_id)

    def weight(self, program: ProgramView, view: KvView, now: float) -> float:
        """Share of a resident program's tokens that counts as demand."""
        if program.status is not ProgramStatus.ACTING or program.acting_since is None:
            return 1.0
        return decay(now - program.acting_since, view.config.decay_lambda)

    def pause_key(self, program: ProgramView, view: KvView, now: float) -> Any:
        """Sort key choosing whom to pause first; see `pause_order`."""
        return pause_order(program)

    def fits(self, plan: Plan, worker_id: str, program: ProgramView) -> bool:
        low = plan.view.config.low_watermark
        return plan.ledger.room(worker_id, low) >= plan.ledger.cost(worker_id, program)

    def choose_worker(self, plan: Plan, program: ProgramView) -> str | None:
        fitting = [
            w for w in plan.ledger.worker_ids()
            if plan.ledger.is_healthy(w) and self.fits(plan, w, program)
        ]
        if program.worker_id in fitting:
            return program.worker_id
        low = plan.view.config.low_watermark
        return min(fitting, key=lambda w: (_leftover(plan, w, program, low), w), default=None)

    def _plan(self, view: KvView, now: float) -> Plan:
        ledger = Ledger(view, lambda p: self.weight(p, view, now), self.share_prefix)
        return Plan(view, ledger, lambda p: self.pause_key(p, view, now))

    def thrash_watermark(self, view: KvView) -> float:
        """Demand above capacity times this is thrashing."""
        return view.config.high_watermark

    def _relieve(self, plan: Plan) -> None:
        high = self.thrash_watermark(plan.view)
        for worker_id in plan.ledger.worker_ids():
            _reclaim(plan, worker_id, high, need=0.0, reason="thrashing")

    def _force_resume(self, plan: Plan, now: float) -> None:
        limit_s = plan.view.config.force_resume_s
        overdue = [p for p in plan.view.programs if p.waiting and now - p.waited_from >= limit_s]
        for program in sorted(overdue, key=lambda p: (p.waited_from, p.program_id)):
            worker_id = _roomiest(plan, program)
            if worker_id is None:
                continue
            high = plan.view.config.high_watermark
            _reclaim(plan, worker_id, high, plan.ledger.cost(worker_id, program), "force-resume")
            if plan.ledger.room(worker_id, high) >= plan.ledger.cost(worker_id, program):
                plan.place(program, worker_id, "force-resume")

    def _restore(self, plan: Plan, until: str | None = None) -> None:
        """Place the global queue in `restore_order`; stop after program `until` (what
        comes later in the order cannot change where, or whether, it is placed)."""
        queue = [p for p in plan.view.programs if p.status in _QUEUE]
        for program in sorted(queue, key=restore_order):
            if program.program_id not in plan.handled:
                worker_id = self.choose_worker(plan, program)
                if worker_id is not None:
                    queued = program.status is ProgramStatus.QUEUED
                    plan.place(program, worker_id, "admit" if queued else "restore")
            if program.program_id == until:
                return


def _leftover(plan: Plan, worker_id: str, program: ProgramView, watermark: float) -> float:
    return plan.ledger.room(worker_id, watermark) - plan.ledger.cost(worker_id, program)


def _reclaim(plan: Plan, worker_id: str, watermark: float, need: float, reason: str) -> None:
    """Evict in pause order until `need` tokens fit under the watermark."""
    for victim in plan.victims(worker_id):
        if plan.ledger.room(worker_id, watermark) >= need:
            return
        plan.evict(victim, reason)


def _roomiest(plan: Plan, program: ProgramView) -> str | None:
    """The healthy worker with most room under the high watermark on which
    `program` fits once everything evictable there is gone; None if none can."""
    high = plan.view.config.high_watermark
    best: tuple[float, str] | None = None
    for worker_id in plan.ledger.worker_ids():
        if not plan.ledger.is_healthy(worker_id):
            continue
        room = plan.ledger.room(worker_id, high)
        evictable = sum(plan.ledger.booked(v.program_id) for v in plan.victims(worker_id))
        if room + evictable < plan.ledger.cost(worker_id, program):
            continue
        if best is None or room > best[0]:
            best = (room, worker_id)
    return None if best is None else best[1]
