"""The tenant each session records, cached (the SLO stack schedules a request as its
session's tenant; daemon/core/tenants.py's `open_program` records it on sessions it
creates)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from daemon import lru
from db import models

if TYPE_CHECKING:
    from db.writer import BatchWriter


class SessionTenants:
    """The tenant each named session records, cached after the first read (the most
    recently used `remember` sessions: a forgotten one is read from the store again)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], writer: BatchWriter,
                 remember: int | None = None) -> None:
        self._sessions = sessions
        self._writer = writer
        self._known: lru.Lru[str, str] = lru.Lru(remember or lru.SESSIONS_REMEMBERED)

    async def of(self, session_id: str) -> str | None:
        """The session's tenant; None for a session the store does not have (yet)."""
        tenant = self._known.get(session_id)
        if tenant is not None:
            return tenant
        async with self._sessions() as s:
            row = await s.get(models.Session, session_id)
        return None if row is None else self._known.setdefault(session_id, row.tenant)

    def created(self, session_id: str, tenant: str, remember: bool = True) -> None:
        """Record the tenant of a session this daemon just created. Of two requests that
        raced to create it, the first one recorded wins. A session nobody will name again
        (a single-request program's) is written but not remembered."""
        if remember and self._known.setdefault(session_id, tenant) != tenant:
            return
        # The core queued the row's insert just before; the batched writer runs this
        # update after it (in its batch or a later one), so it lands either way.
        self._writer.update("sessions", session_id, tenant=tenant)
