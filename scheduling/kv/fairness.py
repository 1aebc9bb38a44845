"""agentd's wait bound: the oldest waiting program is swapped in with a resident one
once it has waited long enough, never by overcommitting a worker.

ThunderAgent's force-resume (scheduling/kv/thunder.py) places every program that
waited `force_resume_s` at once, marking running programs to make room, so for a
while the worker holds both: the engine preempts. Under overload it cannot keep its
promise anyway: with W programs waiting and each owed a turn within
`force_resume_s`, the engine must recompute about W contexts per `force_resume_s`;
past a few dozen agent programs that is more prefill than the GPUs can do, and the
engine does little but recompute. So agentd's bound scales with the queue:

- the oldest waiting program is due once it has waited `force_resume_s` for every
  program waiting per healthy worker (itself included, at least one);
- a due program that fits nowhere reserves a worker (nothing else is placed there
  until it is seated) and swaps in: a victim there is paused (ACTING ones first,
  the one acting longest first, whose tool is the likeliest to run on and whose
  blocks vLLM's LRU frees first; then REASONING ones, shortest first, marked to
  pause when their request ends), and the program is placed once the room is
  really free, in a later step if a marked request still runs.

With at most one program waiting per worker this is ThunderAgent's timeout. Under
overload each worker swaps at most about one context per `force_resume_s`, so forced
turns cannot crowd out the work; a program waits at most about `force_resume_s`
times the waiting programs per worker, plus one request of a victim.

`overdue_first` (an `AgentdOptions` flag) adds a strict tier: every program past
`force_resume_s` is placed before any other, oldest first, each reserving a worker
until it fits.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduling.kv.plan import Plan
from scheduling.kv.view import KvView, ProgramStatus, ProgramView

Choose = Callable[[Plan, ProgramView], str | None]


def overdue(view: KvView, now: float) -> list[ProgramView]:
    """Waiting programs past `force_resume_s`, the longest waiting first."""
    limit = view.config.force_resume_s
    late = [p for p in view.programs if p.waiting and now - p.waited_from >= limit]
    return sorted(late, key=lambda p: (p.waited_from, p.program_id))


def swap_after_s(view: KvView) -> float:
    """How long a program waits before it is due for a swap."""
    waiting = sum(1 for p in view.programs if p.waiting)
    workers = max(1, len(view.healthy_workers()))
    return view.config.force_resume_s * max(1.0, waiting / workers)


def serve_overdue(plan: Plan, now: float, choose: Choose, swaps: bool, tier: bool) -> None:
    """Seat due programs (with `tier`, every overdue one), oldest first: placed where
    `choose` finds room, else reserving a worker and, with `swaps`, swapping in there.
    Stops once every healthy worker is reserved."""
    healthy = [w for w in plan.ledger.worker_ids() if plan.ledger.is_healthy(w)]
    due_s = swap_after_s(plan.view)
    for program in overdue(plan.view, now):
        due = now - program.waited_from >= due_s
        if len(plan.reserved) >= len(healthy) or not (due or tier):
            return
        if program.program_id in plan.handled:
            continue
        worker_id = choose(plan, program)
        if worker_id is not None:
            plan.place(program, worker_id, "overdue")
            continue
        target = reserve_target(plan, program)
        if target is None:
            continue
        plan.reserved.add(target)
        if swaps and due:
            swap_in(plan, target, program)


def reserve_target(plan: Plan, program: ProgramView) -> str | None:
    """The unreserved healthy worker where `program` fits once every program that may
    be paused there is gone: its last worker if that one still caches it, else the
    one with most room now."""
    high = plan.view.config.high_watermark
    best: tuple[bool, float, str] | None = None
    for worker_id in plan.ledger.worker_ids():
        if worker_id in plan.reserved or not plan.ledger.is_healthy(worker_id):
            continue
        room = plan.ledger.room(worker_id, high)
        evictable = sum(plan.ledger.booked(v.program_id) for v in plan.victims(worker_id))
        if room + evictable < plan.ledger.cost(worker_id, program):
            continue
        home = program.kv_resident is True and program.worker_id == worker_id
        key = (home, plan.ledger.room_now(worker_id, high), worker_id)
        if best is None or key > best:
            best = key
    return None if best is None else best[2]


def swap_order(program: ProgramView) -> tuple[bool, float, int, str]:
    """ACTING before REASONING; ACTING longest acting first, REASONING shortest first."""
    reasoning = program.status is ProgramStatus.REASONING
    since = program.acting_since if program.acting_since is not None else 0.0
    return (reasoning, 0.0 if reasoning else since, program.context_tokens,
            program.program_id)


def swap_in(plan: Plan, worker_id: str, program: ProgramView) -> None:
    """Pause victims on `worker_id` in `swap_order` until `program` fits once they are
    gone; place it only when their room is free now (no marked request still runs)."""
    high = plan.view.config.high_watermark
    need = plan.ledger.cost(worker_id, program)
    for victim in sorted(plan.victims(worker_id), key=swap_order):
        if plan.ledger.room(worker_id, high) >= need:
            break
        plan.evict(victim, "swap")
    if plan.ledger.room_now(worker_id, high) >= need:
        plan.place(program, worker_id, "swap")
