"""The core's program lifecycle: a program opened (or loaded back from the store after a
restart), its status changes (each traced and written), its end (callbacks, then it
leaves memory) and release. Mixed into `Core` (daemon/core/core.py), whose state it uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from daemon import lru
from daemon.errors import CoreError
from daemon.state import ProgramState, ProgramStatus
from db import models
from db.writer import BatchWriter

# An ended program stays in memory this long (its consumers read it), then only the store
# has it.
ENDED_PROGRAM_TTL_S = 10.0

_LIVE_STATUSES = [s.value for s in ProgramStatus
                  if s not in (ProgramStatus.STOPPED, ProgramStatus.FAILED)]


class ProgramLifecycle:
    """Core's programs; the attributes are Core's (set in its __init__)."""

    programs: dict[str, ProgramState]
    writer: BatchWriter
    sessions: async_sessionmaker[Any]
    clock: Callable[[], float]
    new_id: Callable[[str], str]
    on_program_end: list[Callable[[ProgramState], None]]
    _known_sessions: lru.Lru[str, bool]

    if TYPE_CHECKING:  # Core's, used here
        async def abort(self, request_id: str, reason: str = "client aborted") -> None: ...

    async def ensure_program(
        self, program_id: str | None, session_id: str | None, pinned: bool = False
    ) -> ProgramState:
        if program_id is not None and program_id in self.programs:
            program = self.programs[program_id]
            if program.status in (ProgramStatus.STOPPED, ProgramStatus.FAILED):
                raise CoreError(
                    f"program '{program_id}' was released ({program.status}); start a new one",
                    status=409, code="program_released",
                )
            if session_id is not None and session_id != program.session_id:
                raise CoreError(
                    f"program '{program_id}' belongs to session '{program.session_id}', "
                    f"not '{session_id}'", status=409, code="session_mismatch",
                )
            return program
        if program_id is not None:
            restored = await self.load_program(program_id)
            if restored is not None:
                self.programs[program_id] = restored
                return await self.ensure_program(program_id, session_id, pinned)
        return self._create_program(program_id or self.new_id("prog"), session_id, pinned)

    async def load_program(self, program_id: str) -> ProgramState | None:
        async with self.sessions() as s:
            row = await s.get(models.Program, program_id)
        if row is None:
            return None
        self._known_sessions.setdefault(row.session_id, True)
        return ProgramState(
            id=row.id, session_id=row.session_id, status=ProgramStatus(row.status),
            created_at=row.created_at, status_since=row.status_since, worker_id=row.worker_id,
            context_tokens=row.context_tokens, steps=row.steps, pinned=row.pinned,
        )

    def _create_program(
        self, program_id: str, session_id: str | None, pinned: bool
    ) -> ProgramState:
        now = self.clock()
        sid = session_id or program_id
        if self._known_sessions.get(sid) is None:
            self._known_sessions.setdefault(sid, True)
            # the cache forgets: a session it no longer holds may have its row already
            self.writer.insert("sessions", _session_row(sid, now), if_absent=True)
        program = ProgramState(
            id=program_id, session_id=sid, status=ProgramStatus.QUEUED,
            created_at=now, status_since=now, pinned=pinned,
        )
        self.programs[program_id] = program
        self.writer.insert("programs", {
            "id": program_id, "session_id": sid, "status": program.status.value,
            "worker_id": None, "context_tokens": 0, "steps": 0, "pinned": pinned,
            "status_reason": "created", "created_at": now, "status_since": now,
            "stopped_at": None,
        })
        self.writer.trace("program.created", session_id=sid, program_id=program_id)
        return program

    async def live_program_ids(self) -> set[str]:
        async with self.sessions() as s:
            rows = await s.scalars(
                select(models.Program.id).where(models.Program.status.in_(_LIVE_STATUSES)))
            return set(rows.all())

    async def load_known_sessions(self) -> None:
        """The sessions of live programs, the ones named again soon after a restart; not
        every session the store has (it grows with the daemon's history)."""
        query = (select(models.Program.session_id).distinct()
                 .where(models.Program.status.in_(_LIVE_STATUSES))
                 .limit(self._known_sessions.cap))
        async with self.sessions() as s:
            for sid in (await s.scalars(query)).all():
                self._known_sessions.setdefault(sid, True)

    def set_program_status(self, program: ProgramState, status: ProgramStatus, reason: str) -> None:
        if program.status == status:
            return
        now = self.clock()
        old = program.status
        program.status = status
        program.status_since = now
        values: dict[str, Any] = {
            "status": status.value, "status_since": now, "status_reason": reason,
            "worker_id": program.worker_id, "context_tokens": program.context_tokens,
            "steps": program.steps,
        }
        ended = status in (ProgramStatus.STOPPED, ProgramStatus.FAILED)
        if ended:
            values["stopped_at"] = now
        self.writer.update("programs", program.id, **values)
        self.writer.trace(
            "program.status", session_id=program.session_id, program_id=program.id,
            old=old.value, new=status.value, reason=reason,
        )
        if ended:
            for callback in self.on_program_end:
                callback(program)
            # Ended programs leave memory (the store has them) once handlers are done.
            asyncio.get_running_loop().call_later(ENDED_PROGRAM_TTL_S, self._forget, program)

    def _forget(self, program: ProgramState) -> None:
        if self.programs.get(program.id) is program:
            del self.programs[program.id]

    async def release_program(self, program_id: str) -> ProgramState:
        program = self.programs.get(program_id) or await self.load_program(program_id)
        if program is None:
            raise CoreError(f"unknown program '{program_id}'", status=404, code="not_found")
        self.programs[program_id] = program
        if program.status in (ProgramStatus.STOPPED, ProgramStatus.FAILED):
            raise CoreError(
                f"program '{program_id}' is already released", status=409, code="already_released"
            )
        if program.active_request is not None:
            await self.abort(program.active_request, reason="program released")
        self.set_program_status(program, ProgramStatus.STOPPED, "released")
        await self.writer.flush()
        return program


def _session_row(sid: str, now: float) -> dict[str, Any]:
    return {
        "id": sid, "tenant": "default", "priority": 0, "slo_class": "default",
        "pinned_worker": None, "state": {}, "created_at": now, "updated_at": now,
    }
