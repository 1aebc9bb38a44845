"""Program views for the pure KV-policy tests, all created at NOW."""

from __future__ import annotations

from typing import Any

from scheduling.kv import ProgramStatus, ProgramView

R, A, P, Q = (ProgramStatus.REASONING, ProgramStatus.ACTING, ProgramStatus.PAUSED,
              ProgramStatus.QUEUED)
NOW = 100.0


def prog(pid: str, status: ProgramStatus, tokens: int, worker: str | None = "w0",
         **kw: Any) -> ProgramView:
    """An ACTING program acts since NOW unless told; a QUEUED one has no worker."""
    kw.setdefault("acting_since", NOW if status is A else None)
    return ProgramView(pid, status, tokens, created_at=NOW,
                       worker_id=None if status is Q else worker, **kw)
