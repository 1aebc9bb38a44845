"""What a KV policy asks the daemon to do. The daemon applies them in list order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pause:
    """Unbind the program from its worker; its KV may be evicted.

    Only issued for programs without a running request, except by an operator
    migration with `now=True`, where the daemon aborts the request and re-queues it.
    """

    program_id: str
    worker_id: str
    reason: str


@dataclass(frozen=True)
class MarkPauseAfterRequest:
    """A REASONING program cannot be interrupted: pause it when its request ends.

    With `restore_on` set (operator migration) the daemon restores it there at once.
    """

    program_id: str
    reason: str
    restore_on: str | None = None


@dataclass(frozen=True)
class Restore:
    """Bind a PAUSED program to a worker: REASONING if it has a pending request
    (the daemon dispatches it there), ACTING otherwise."""

    program_id: str
    worker_id: str
    reason: str


@dataclass(frozen=True)
class Admit:
    """Bind a QUEUED program to a worker and dispatch its first request."""

    program_id: str
    worker_id: str
    reason: str = "admit"


Decision = Pause | MarkPauseAfterRequest | Restore | Admit


def placements(decisions: list[Decision]) -> dict[str, str]:
    """program id -> worker for every Admit and Restore in `decisions`."""
    return {
        d.program_id: d.worker_id for d in decisions if isinstance(d, Admit | Restore)
    }
