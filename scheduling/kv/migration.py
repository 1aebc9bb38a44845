"""Operator-driven migration of one program to a chosen worker."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.kv.decisions import Admit, Decision, MarkPauseAfterRequest, Pause, Restore
from scheduling.kv.ledger import Ledger
from scheduling.kv.view import KvView, ProgramStatus, ProgramView


@dataclass(frozen=True)
class MigrationPlan:
    decisions: tuple[Decision, ...]
    recompute_tokens: int  # prefill the target must redo; 0 for a first admission


def plan_migration(
    view: KvView, program_id: str, target_worker_id: str, now: bool = False
) -> MigrationPlan:
    """Decisions that move `program_id` to `target_worker_id`.

    KV is not copied between workers; the target recomputes the context, less any
    prefix its prefix group already holds there; on another node than the one its KV is
    on, all of it. Moving back to its own worker costs
    nothing only when its blocks are known to be cached there (`kv_resident` True, or the
    uncached rest when the engine's events say how much is cached); unknown counts as
    evicted, so the reported cost is an upper bound. A REASONING program moves when its
    request ends, unless `now`, in which case the daemon aborts the request and
    re-dispatches it on the target. Pinned programs move too: the operator asked.
    """
    program = view.program(program_id)
    source = program.worker_id
    if program.status is ProgramStatus.STOPPED:
        raise ValueError(f"program {program_id} is stopped")
    if source == target_worker_id and program.status is not ProgramStatus.PAUSED:
        return MigrationPlan((), 0)
    return MigrationPlan(
        _moves(program, target_worker_id, now), _recompute(view, program, target_worker_id)
    )


def _moves(program: ProgramView, target: str, now: bool) -> tuple[Decision, ...]:
    pid = program.program_id
    if program.status is ProgramStatus.QUEUED:
        return (Admit(pid, target, "migrate"),)
    if program.status is ProgramStatus.PAUSED or program.worker_id is None:
        return (Restore(pid, target, "migrate"),)
    if program.status is ProgramStatus.REASONING and not now:
        return (MarkPauseAfterRequest(pid, "migrate", restore_on=target),)
    return (Pause(pid, program.worker_id, "migrate"), Restore(pid, target, "migrate"))


def _recompute(view: KvView, program: ProgramView, target: str) -> int:
    if program.status is ProgramStatus.QUEUED:
        return 0
    if view.crosses_node(program, target):
        return program.context_tokens
    home = program.recompute_at_home() if program.worker_id == target else None
    if home == 0:
        return 0
    others = KvView(
        view.workers,
        tuple(p for p in view.programs if p.program_id != program.program_id),
        view.config,
    )
    cached = Ledger(others, lambda _: 1.0, share_prefix=True).cached_prefix(target, program)
    prefix = program.context_tokens - cached
    return prefix if home is None else min(home, prefix)
