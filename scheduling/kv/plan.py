"""Mutable scratch state of one decision step: the ledger plus what was decided."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from scheduling.kv.decisions import Admit, Decision, MarkPauseAfterRequest, Pause, Restore
from scheduling.kv.ledger import Ledger
from scheduling.kv.view import KvView, ProgramStatus, ProgramView


class Plan:
    """Decisions accumulate here while the ledger tracks their effect on demand.

    Invariant: a program appears in at most one decision per step (`handled`), so
    nothing paused in a step is restored in the same step. `reserved` workers are
    held for an overdue program that does not fit yet: policies that honour it
    place nothing else there in this step.
    """

    def __init__(
        self, view: KvView, ledger: Ledger, pause_key: Callable[[ProgramView], Any] | None = None
    ) -> None:
        self.view = view
        self.pause_key = pause_key or pause_order
        self.ledger = ledger
        self.decisions: list[Decision] = []
        self.handled: set[str] = set()
        self.admitted = Counter[str]()
        self.reserved: set[str] = set()

    def evict(self, program: ProgramView, reason: str) -> None:
        """Pause an ACTING program now, or mark a REASONING one for later."""
        assert program.worker_id is not None
        reasoning = program.status is ProgramStatus.REASONING
        if reasoning:
            self.decisions.append(MarkPauseAfterRequest(program.program_id, reason))
        else:
            self.decisions.append(Pause(program.program_id, program.worker_id, reason))
        self.ledger.unbook(program.program_id, leaving=reasoning)
        self.handled.add(program.program_id)

    def place(self, program: ProgramView, worker_id: str, reason: str) -> None:
        if program.status is ProgramStatus.QUEUED:
            self.decisions.append(Admit(program.program_id, worker_id, reason))
            self.admitted[worker_id] += 1
        else:
            self.decisions.append(Restore(program.program_id, worker_id, reason))
        self.ledger.book(worker_id, program)
        self.handled.add(program.program_id)

    def victims(self, worker_id: str) -> list[ProgramView]:
        """Programs on `worker_id` that may still be paused this step, in pause order."""
        candidates = [
            p
            for p in self.view.on_worker(worker_id)
            if not p.pinned and not p.pause_marked and p.program_id not in self.handled
        ]
        return sorted(candidates, key=self.pause_key)


def pause_order(program: ProgramView) -> tuple[bool, int, str]:
    """ACTING before REASONING (a tool wait holds memory nobody uses), then shortest
    first (recompute cost grows faster than linearly with context length)."""
    reasoning = program.status is ProgramStatus.REASONING
    return (reasoning, program.context_tokens, program.program_id)


def restore_order(program: ProgramView) -> tuple[int, int, str]:
    """Pending requests of paused programs first (their work is ready and was
    interrupted), then new programs, then paused programs still in a tool."""
    if program.status is ProgramStatus.PAUSED and program.pending_request:
        rank = 0
    elif program.status is ProgramStatus.QUEUED:
        rank = 1
    else:
        rank = 2
    return (rank, program.context_tokens, program.program_id)
