"""Autellix's program-level least-attained-service scheduling as a KV policy.

Source: Luo et al., "Autellix: An Efficient Serving Engine for LLM Agents as General
Programs", 2025 (arXiv:2502.13965), §4: PLAS (program-level attained service, for
single-threaded programs) and ATLAS (its multi-threaded form, which takes the attained
service along the program's critical path). A call's priority is the service its whole
program has received so far, not the call's own; priorities are discretised into a few
queues (a multi-level feedback queue), first come first served within a queue, higher
queues preempt lower ones, and a call that has waited too long is promoted to the top
queue so that long programs do not starve. A daemon program issues one LLM call at a time
(its threads are separate programs), so its critical path is its whole history and PLAS
and ATLAS coincide here.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.kv.decisions import Decision, Pause, placements
from scheduling.kv.ledger import Ledger
from scheduling.kv.plan import Plan
from scheduling.kv.policy import KvPolicy
from scheduling.kv.view import RESIDENT, KvView, ProgramStatus, ProgramView


@dataclass(frozen=True)
class PlasOptions:
    """`first_queue_tokens`: attained service below which a program is in the top queue;
    each lower queue's bound is `queue_ratio` times the one above (Autellix's queues also
    grow geometrically); `queues`: how many there are. `preempt`: a waiting program that
    fits nowhere may pause running programs of strictly lower queues on one worker (their
    requests are requeued and recomputed, as Autellix's engine preempts running calls)."""

    first_queue_tokens: int = 4096
    queue_ratio: float = 4.0
    queues: int = 5
    preempt: bool = True


def attained_service(program: ProgramView) -> int:
    """The service the program has received, in tokens.

    Autellix counts the time its completed calls ran. In token units that is every token
    its context holds: each was prefilled or decoded for it once (a recompute after an
    eviction is extra work the engine did, not progress of the program). The view's
    context also counts a waiting request's new prompt, which is not served yet; that is
    one step's new tokens, small beside what a long program has accumulated."""
    return program.context_tokens


def queue_index(service: int, options: PlasOptions) -> int:
    """0 for the top queue; the bounds are first_queue_tokens * queue_ratio**i."""
    bound = float(options.first_queue_tokens)
    for index in range(options.queues - 1):
        if service < bound:
            return index
        bound *= options.queue_ratio
    return options.queues - 1


class AutellixPlasPolicy(KvPolicy):
    """PLAS at the program level of the KV layer (Autellix, Luo et al. 2025).

    Every call is scheduled: when a request ends, its program is paused (Autellix keeps no
    room for a program between calls; vLLM's prefix cache keeps its blocks until evicted),
    so its next call queues with everyone else's. Waiting programs are placed in order of
    (queue of their program's attained service, arrival of the call), a program waiting
    `config.force_resume_s` or longer counting as top queue (anti-starvation), onto the
    worker it last ran on when it fits there (its blocks may still be cached), else onto
    the fitting worker with most room. Admission stops at capacity times the low watermark
    counting running requests only. With `preempt`, a waiting program that fits nowhere
    pauses running programs of strictly lower queues (highest attained service first) on
    the worker where that frees enough. Pinned programs are never paused.
    """

    name = "autellix-plas"

    def __init__(self, options: PlasOptions | None = None) -> None:
        self.options = options or PlasOptions()

    def priority(self, program: ProgramView, view: KvView, now: float) -> tuple[int, float, str]:
        """Sort key of a waiting program: queue (0 when starved), then call arrival."""
        starved = now - program.waited_from >= view.config.force_resume_s
        queue = 0 if starved else queue_index(attained_service(program), self.options)
        return (queue, program.waited_from, program.program_id)

    def decide(self, view: KvView, now: float) -> list[Decision]:
        plan = self._plan(view)
        for release in self._release_acting(view):
            plan.decisions.append(release)
            plan.ledger.unbook(release.program_id)
            plan.handled.add(release.program_id)
        self._place(plan, now, preempt=self.options.preempt)
        return plan.decisions

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        program = view.program(program_id)
        if program.status in RESIDENT:
            return view.home_worker(program)
        if not program.waiting:
            return None
        # Placing only: a route may not rely on pauses not yet applied.
        plan = self._plan(view)
        self._place(plan, now, preempt=False, until=program_id)
        return placements(plan.decisions).get(program_id)

    def on_request_end(self, view: KvView, program_id: str, now: float) -> list[Decision]:
        program = view.program(program_id)
        if program.worker_id is None or program.pinned:
            return super().on_request_end(view, program_id, now)
        return [Pause(program_id, program.worker_id, "call-ended")]

    def _plan(self, view: KvView) -> Plan:
        return Plan(view, Ledger(view, lambda p: 1.0), self._victim_key)

    def _victim_key(self, program: ProgramView) -> tuple[bool, int, str]:
        """Preempt acting programs before running ones, then most attained service."""
        reasoning = program.status is ProgramStatus.REASONING
        return (reasoning, -attained_service(program), program.program_id)

    @staticmethod
    def _release_acting(view: KvView) -> list[Pause]:
        """Programs between calls hold no room (a request that ended before this policy
        was installed left its program ACTING)."""
        return [Pause(p.program_id, p.worker_id, "between-calls") for p in view.programs
                if p.status is ProgramStatus.ACTING and p.worker_id is not None
                and not p.pinned and not p.pause_marked]

    def _place(self, plan: Plan, now: float, preempt: bool, until: str | None = None) -> None:
        view = plan.view
        queue = sorted((p for p in view.programs if p.waiting),
                       key=lambda p: self.priority(p, view, now))
        for program in queue:
            if program.program_id in plan.handled:
                continue
            worker_id = self._target(plan, program)
            if worker_id is None and preempt:
                worker_id = self._preempt_for(plan, program, now)
            if worker_id is not None:
                queued = program.status is ProgramStatus.QUEUED
                plan.place(program, worker_id, "plas-admit" if queued else "plas-restore")
            if program.program_id == until:
                return

    def _room(self, plan: Plan, worker_id: str, program: ProgramView) -> float:
        low = plan.view.config.low_watermark
        return plan.ledger.room_now(worker_id, low) - plan.ledger.cost(worker_id, program)

    def _target(self, plan: Plan, program: ProgramView) -> str | None:
        fitting = [w for w in plan.ledger.worker_ids()
                   if plan.ledger.is_healthy(w) and self._room(plan, w, program) >= 0]
        home = plan.view.home_worker(program)
        if home in fitting:
            return home
        return max(fitting, key=lambda w: (self._room(plan, w, program), w), default=None)

    def _preempt_for(self, plan: Plan, program: ProgramView, now: float) -> str | None:
        """Pause lower-queue programs on the first worker (its home first) where that
        makes `program` fit; None when no worker can be freed enough."""
        mine = self.priority(program, plan.view, now)[0]

        def lower(victim: ProgramView) -> bool:
            return queue_index(attained_service(victim), self.options) > mine

        home = plan.view.home_worker(program)
        order = sorted(plan.ledger.worker_ids(), key=lambda w: (w != home, w))
        for worker_id in order:
            if not plan.ledger.is_healthy(worker_id):
                continue
            victims = [v for v in plan.victims(worker_id) if lower(v)]
            freeable = sum(plan.ledger.booked(v.program_id) for v in victims)
            if self._room(plan, worker_id, program) + freeable < 0:
                continue
            for victim in victims:
                if self._room(plan, worker_id, program) >= 0:
                    break
                # A Pause, not a mark: Autellix preempts the running call itself.
                plan.decisions.append(Pause(victim.program_id, worker_id, "plas-preempt"))
                plan.ledger.unbook(victim.program_id)
                plan.handled.add(victim.program_id)
            return worker_id
        return None
