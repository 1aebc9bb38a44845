"""Which waiting programs prepare their declared tools: the head of the global queue."""

from __future__ import annotations

from daemon.toolsvc.service import queue_head
from scheduling.kv import ProgramStatus, ProgramView


def view(pid: str, status: ProgramStatus, tokens: int = 100, pending: bool = False,
         ) -> ProgramView:
    return ProgramView(program_id=pid, status=status, context_tokens=tokens, created_at=0.0,
                       pending_request=pending)


def test_queue_head_follows_restore_order_and_skips_resident_programs() -> None:
    programs = [
        view("running", ProgramStatus.REASONING),
        view("acting", ProgramStatus.ACTING),
        view("paused-in-tool", ProgramStatus.PAUSED, tokens=10),
        view("new-big", ProgramStatus.QUEUED, tokens=900),
        view("new-small", ProgramStatus.QUEUED, tokens=50),
        view("paused-ready", ProgramStatus.PAUSED, tokens=5000, pending=True),
    ]
    # Paused with a ready request first, then new programs shortest first.
    assert queue_head(programs, 1) == {"paused-ready"}
    assert queue_head(programs, 2) == {"paused-ready", "new-small"}
    assert queue_head(programs, 3) == {"paused-ready", "new-small", "new-big"}
    assert queue_head(programs, 10) == {"paused-ready", "new-small", "new-big", "paused-in-tool"}
    assert queue_head(programs, 0) == set()
