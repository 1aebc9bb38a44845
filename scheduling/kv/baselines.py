"""Baseline KV policies under the same interface, for comparison runs."""

from __future__ import annotations

from scheduling.kv.decisions import Admit, Decision, Pause, Restore, placements
from scheduling.kv.ledger import Ledger
from scheduling.kv.plan import Plan
from scheduling.kv.policy import KvPolicy
from scheduling.kv.view import RESIDENT, KvView, ProgramStatus, ProgramView


def least_loaded(view: KvView, extra: dict[str, int] | None = None) -> str | None:
    """Healthy worker with the smallest used fraction, counting `extra` tokens
    already sent there in this step."""
    extra = extra or {}

    def load(worker_id: str, used: int, capacity: int) -> tuple[float, str]:
        return ((used + extra.get(worker_id, 0)) / max(capacity, 1), worker_id)

    loads = [load(w.worker_id, w.used_tokens, w.capacity_tokens) for w in view.healthy_workers()]
    return min(loads, default=(0.0, None))[1]


def _admit_all(view: KvView) -> list[Decision]:
    """Bind every waiting program to the least-loaded worker; the engine copes."""
    sent: dict[str, int] = {}
    decisions: list[Decision] = []
    for program in sorted(view.programs, key=lambda p: (p.waited_from, p.program_id)):
        if not program.waiting:
            continue
        worker_id = least_loaded(view, sent)
        if worker_id is None:
            break
        sent[worker_id] = sent.get(worker_id, 0) + program.context_tokens
        decisions.append(bind(program, worker_id, "admit-all"))
    return decisions


def bind(program: ProgramView, worker_id: str, reason: str) -> Decision:
    """Admit a QUEUED program, restore a PAUSED one."""
    if program.status is ProgramStatus.QUEUED:
        return Admit(program.program_id, worker_id, reason)
    return Restore(program.program_id, worker_id, reason)


class VllmDefaultPolicy(KvPolicy):
    """No program awareness: every request goes to the least-loaded worker and
    nothing is ever paused; the engine's own eviction and preemption decide."""

    name = "vllm-default"

    def decide(self, view: KvView, now: float) -> list[Decision]:
        return _admit_all(view)

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        return least_loaded(view)


class StickyPolicy(KvPolicy):
    """Session affinity: a program's requests all go to the worker it first
    landed on (least-loaded for new programs); nothing is ever paused."""

    name = "sticky"

    def decide(self, view: KvView, now: float) -> list[Decision]:
        return _admit_all(view)

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        program = view.program(program_id)
        return view.home_worker(program) or least_loaded(view)


class ContinuumTtlPolicy(KvPolicy):
    """Continuum: after each request a program's KV stays pinned for a TTL equal to
    its predicted tool time (mean of its past tool times, else a default). Routing
    is sticky. A waiting request is admitted, oldest first, only while pinned plus
    reasoning tokens stay within capacity; a program is paused only once its TTL
    has expired, and never to make room."""

    name = "continuum-ttl"

    def decide(self, view: KvView, now: float) -> list[Decision]:
        decisions = self._expire(view, now)
        return decisions + self._admit(view, now, {d.program_id for d in decisions})

    def route(self, view: KvView, program_id: str, now: float) -> str | None:
        program = view.program(program_id)
        if program.status in RESIDENT:
            return view.home_worker(program)
        return placements(self._admit(view, now, set())).get(program_id)

    def ttl(self, view: KvView, program: ProgramView) -> float:
        mean = program.tool_time_mean_s
        return view.config.default_tool_time_s if mean is None else mean

    def _expire(self, view: KvView, now: float) -> list[Decision]:
        return [
            Pause(p.program_id, p.worker_id, "ttl-expired")
            for p in view.programs
            if p.status is ProgramStatus.ACTING and p.worker_id is not None and not p.pinned
            and p.acting_since is not None and now - p.acting_since >= self.ttl(view, p)
        ]

    def _admit(self, view: KvView, now: float, expired: set[str]) -> list[Decision]:
        plan = Plan(view, Ledger(view, lambda p: 0.0 if p.program_id in expired else 1.0))
        waiting = sorted((p for p in view.programs if p.waiting), key=lambda p: p.waited_from)
        for program in waiting:
            worker_id = self._target(plan, program)
            if worker_id is not None:
                plan.place(program, worker_id, "ttl-admit")
        return plan.decisions

    def _target(self, plan: Plan, program: ProgramView) -> str | None:
        def room(worker_id: str) -> float:
            return plan.ledger.room(worker_id, 1.0) - plan.ledger.cost(worker_id, program)

        own = plan.view.home_worker(program)
        if own is not None:
            return own if room(own) >= 0 else None
        healthy = [w for w in plan.ledger.worker_ids() if plan.ledger.is_healthy(w)]
        best = max(healthy, key=lambda w: (room(w), w), default=None)
        return best if best is not None and room(best) >= 0 else None
