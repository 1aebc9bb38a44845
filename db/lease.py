"""The store's lease: which one of the daemons on a PostgreSQL database is the active one.

It is a session-level advisory lock held on a connection of its own. PostgreSQL ends the
lock with the session, so it lapses the moment the holder's connection dies: the process
killed (-9 included), its host gone (TCP keepalive), or the server restarted. A standby
waits in `pg_advisory_lock` and gets the lock then; nothing is polled, no clock is
trusted. The holder checks its connection every `check_s` and is told when it lost it
(`on_lost`): it must stop acting, for a standby may own the store by then.

Fencing: the new holder ends the old one's other connections (`fence`), so a holder that
has not noticed its loss yet cannot commit through its pool afterwards. Every daemon
connection carries `application_name` "agentd:<instance>" for that; a standby's lease
connection ends in ":standby" and is left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

log = logging.getLogger("agentd.lease")

# the advisory lock key of the daemon lease (any constant only agentd uses; the
# migrations' lock is another)
LEASE_KEY = 0x61676E7464_02
APP_PREFIX = "agentd:"
HANG_S = 30.0  # a lease connection that does not answer SELECT 1 for this long is lost


class LeaseLost(Exception):
    """The lease's connection failed: another daemon may hold the store now."""


def application_name(instance: str, role: str = "") -> str:
    return f"{APP_PREFIX}{instance}{':' + role if role else ''}"


def supports_lease(url: str) -> bool:
    return url.startswith("postgresql")


class StoreLease:
    def __init__(self, url: str, instance: str, check_s: float = 1.0,
                 on_lost: Callable[[str], None] | None = None) -> None:
        self.instance = instance
        self.check_s = check_s
        self.on_lost = on_lost
        self._url = url
        self._engine: AsyncEngine | None = None
        self._conn: AsyncConnection | None = None
        self._watch: asyncio.Task[None] | None = None
        self.held = False

    async def _connect(self, role: str) -> AsyncConnection:
        self._engine = create_async_engine(
            self._url, poolclass=NullPool,
            connect_args={"server_settings": {"application_name":
                                              application_name(self.instance, role)}})
        self._conn = await self._engine.connect()
        # its own autocommit session: a lock taken outside any transaction is the session's
        await self._conn.execution_options(isolation_level="AUTOCOMMIT")
        return self._conn

    async def try_acquire(self) -> bool:
        """Take the lease if no one holds it; False (and nothing held) if someone does."""
        conn = await self._connect("")
        got = bool(await conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": LEASE_KEY}))
        if not got:
            await self.close()
            return False
        self.held = True
        return True

    async def wait_acquire(self) -> None:
        """Wait, as a standby, until the holder's session ends, then hold the lease."""
        conn = await self._connect("standby")
        await conn.scalar(text("SELECT pg_advisory_lock(:k)"), {"k": LEASE_KEY})
        self.held = True
        # now an active daemon's connection, no longer a standby's (see `fence`)
        await conn.execute(text("SELECT set_config('application_name', :n, false)"),
                           {"n": application_name(self.instance)})

    async def holder(self) -> str | None:
        """The application name of the session holding the lease, if any (for messages)."""
        engine = create_async_engine(self._url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                name = await conn.scalar(text(
                    "SELECT a.application_name || ' (pid ' || a.pid || ', from ' ||"
                    " coalesce(host(a.client_addr), 'local') || ')' FROM pg_locks l"
                    " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
                    " AND l.granted AND l.database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())"
                    " AND ((l.classid::bigint << 32) | l.objid::bigint) = :k"), {"k": LEASE_KEY})
                return None if name is None else str(name)
        finally:
            await engine.dispose()

    async def fence(self) -> int:
        """End every other daemon's connections to this database but standbys' lease
        connections: what an old holder still has open cannot commit after the takeover.
        Returns how many were ended."""
        assert self._conn is not None and self.held
        ended = await self._conn.scalar(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND application_name LIKE :prefix AND application_name NOT LIKE :standby"
            " AND application_name NOT LIKE :mine"),
            {"prefix": f"{APP_PREFIX}%", "standby": "%:standby",
             "mine": f"{application_name(self.instance)}%"})
        return int(ended or 0)

    def start_watch(self) -> None:
        """Check the lease's connection every `check_s`; on failure call `on_lost` once."""
        self._watch = asyncio.create_task(self._watch_loop(), name="store-lease-watch")

    async def _watch_loop(self) -> None:
        assert self._conn is not None
        while True:
            await asyncio.sleep(self.check_s)
            try:
                # Only a failure of the session is a loss, not a slow answer: a loaded
                # machine (or event loop) answered SELECT 1 in over 2 s in a test, and
                # exiting then would give up a lease no one else could take. The timeout
                # is for a connection that hangs (a silent network cut).
                async with asyncio.timeout(HANG_S):
                    await self._conn.scalar(text("SELECT 1"))
            except Exception as exc:  # any failure: the session, so the lock, may be gone
                self.held = False
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log.error("lost the store lease (%s)", reason)
                if self.on_lost is not None:
                    self.on_lost(reason)
                return

    async def close(self) -> None:
        """Give the lease up (closing its session releases the lock)."""
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
        self.held = False


def this_instance() -> str:
    """This daemon process, as its connections name it: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"
