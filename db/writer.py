"""One batched writer for everything the hot path records.

The scheduler and the gateway never wait on disk: they enqueue row operations
and go on. A background task commits them in order, one transaction per batch,
so a batch is all-or-nothing and a crash loses at most the last flush interval.
Callers that must know a write is durable (an API that acknowledges a change)
await `flush()`, or `durable(mark)` to also learn that no batch failed meanwhile.
Either makes the writer commit at once rather than at its next interval, and all
who wait while a commit runs share the next one (group commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.models import Base

log = logging.getLogger("agentd.store")


@dataclass(frozen=True, slots=True)
class _Insert:
    table: Table
    row: dict[str, Any]
    if_absent: bool = False


@dataclass(frozen=True, slots=True)
class _Update:
    table: Table
    key: Any
    values: dict[str, Any]


_Op = _Insert | _Update


class NotDurable(Exception):
    """A batch failed to commit after the caller's mark: what it wrote may be lost."""


class BatchWriter:
    def __init__(self, engine: AsyncEngine, interval_s: float = 0.05, max_batch: int = 2000,
                 keep: bool = True, clock: Callable[[], float] = time.time):
        self._engine = engine
        self._clock = clock  # trace timestamps: wall time, or a replay's virtual time
        # False: operations are counted as committed and dropped, for a replay that keeps
        # no store (daemon/replay/virtual.py without --store).
        self._keep = keep
        self._interval = interval_s
        self._max_batch = max_batch
        self._pending: list[_Op] = []
        self._wake = asyncio.Event()
        self._flushed = asyncio.Condition()
        self._enqueued = 0
        self._committed = 0
        self._failed_batches = 0
        self._task: asyncio.Task[None] | None = None
        self.events_written = 0
        self._last_ts = 0.0
        self.last_error: str | None = None
        # Called with each trace row as it is enqueued: parts that derive their own
        # records from the facts the daemon traces (daemon/history/events.py) follow here,
        # so no place that knows a fact needs to know who else wants it.
        self.trace_observers: list[Callable[[dict[str, Any]], None]] = []

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="store-writer")

    async def stop(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def insert(self, table_name: str, row: dict[str, Any], if_absent: bool = False) -> None:
        """`if_absent`: a row whose key the store already has is left as it is (the
        caller's record of what it stored is a bounded cache, so it may insert twice)."""
        self._push(_Insert(Base.metadata.tables[table_name], row, if_absent))

    def update(self, table_name: str, key: Any, **values: Any) -> None:
        self._push(_Update(Base.metadata.tables[table_name], key, values))

    def trace(self, kind: str, **fields: Any) -> None:
        # Stamped at enqueue and never decreasing, so a trace read in id order is
        # also in time order, even across a wall-clock step backwards.
        self._last_ts = max(self._last_ts, self._clock())
        row = {
            "ts": self._last_ts,
            "kind": kind,
            "session_id": fields.pop("session_id", None),
            "program_id": fields.pop("program_id", None),
            "request_id": fields.pop("request_id", None),
            "worker_id": fields.pop("worker_id", None),
            "data": fields,
        }
        self.insert("trace_events", row)
        for observe in self.trace_observers:
            observe(row)

    def _push(self, op: _Op) -> None:
        self._enqueued += 1
        if not self._keep:
            self._committed += 1
            return
        self._pending.append(op)
        if len(self._pending) >= self._max_batch:
            self._wake.set()

    async def flush(self) -> None:
        """Wait until everything enqueued so far is committed."""
        target = self._enqueued
        if self._committed >= target:
            return
        self._wake.set()
        async with self._flushed:
            await self._flushed.wait_for(lambda: self._committed >= target)

    def mark(self) -> int:
        """A point to check durability from; see `durable`."""
        return self._failed_batches

    async def durable(self, since: int) -> None:
        """Wait until everything enqueued so far is committed; raise NotDurable if any
        batch failed after `since` (a `mark()`), for then a write the caller made, or
        one still pending when it took the mark, may be lost. A failure of an unrelated
        batch in that span also raises: it cannot tell, and a store that fails is rare."""
        if self._task is None or self._task.done():
            raise NotDurable("the store writer is not running")  # a flush would never end
        await self.flush()
        if self._failed_batches != since:
            raise NotDurable(self.last_error or "a store batch failed")

    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that lands as
            # the wait completes, and stop() then waits for ever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            batch, self._pending = self._pending, []
            await self._commit(batch)
            async with self._flushed:
                self._committed += len(batch)
                self._flushed.notify_all()

    async def _commit(self, batch: list[_Op]) -> None:
        inserts, if_absent, updates = _coalesce(batch)
        try:
            async with self._engine.begin() as conn:
                for table in Base.metadata.sorted_tables:  # parents before children
                    new_rows = inserts.get(table.name)
                    if new_rows:
                        await conn.execute(insert(table), list(new_rows.values()))
                    maybe_new = if_absent.get(table.name)
                    if maybe_new:
                        await _insert_absent(conn, table, maybe_new)
                for (table, columns), rows in updates.items():
                    pk = next(iter(table.primary_key.columns))
                    stmt = (update(table).where(pk == bindparam("_key"))
                            .values({c: bindparam(c) for c in columns}))
                    await conn.execute(stmt, rows)
            self.events_written += len(inserts.get("trace_events", ()))
            self.last_error = None
        except Exception as exc:  # keep serving; the error is visible in /healthz
            self._failed_batches += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("store batch of %d operations failed", len(batch))


_Inserts = dict[str, dict[Any, dict[str, Any]]]
_Updates = dict[tuple[Table, tuple[str, ...]], list[dict[str, Any]]]


# dialects whose INSERT takes ON CONFLICT DO NOTHING
_ON_CONFLICT: dict[str, Callable[[Table], Any]] = {
    "sqlite": sqlite.insert, "postgresql": postgresql.insert}


async def _insert_absent(conn: AsyncConnection, table: Table,
                         rows: dict[Any, dict[str, Any]]) -> None:
    """Insert the rows whose key the table does not have yet; leave the others."""
    make = _ON_CONFLICT.get(conn.dialect.name)
    if make is not None:
        await conn.execute(make(table).on_conflict_do_nothing(), list(rows.values()))
        return
    # elsewhere: the batch's transaction reads which keys exist, then inserts the rest
    pk = next(iter(table.primary_key.columns))
    have = set((await conn.execute(select(pk).where(pk.in_(list(rows))))).scalars())
    new_rows = [row for key, row in rows.items() if key not in have]
    if new_rows:
        await conn.execute(insert(table), new_rows)


def _coalesce(batch: list[_Op]) -> tuple[_Inserts, _Inserts, _Updates]:
    """Fold a batch into one insert per new row and one update per changed row;
    returns the plain inserts, the inserts `if_absent`, and the updates.

    The batch commits as one transaction, so only its final state matters: an update
    of a row inserted in the same batch merges into the insert, and several updates
    of one row merge into one. Updates with the same columns run as one executemany.
    An insert `if_absent` takes no update into it: the store may keep its own row and
    skip the insert, and the update must still land, so it runs after the insert.
    Of two such inserts of one key, the first stands, as it would in the store.
    """
    inserts: _Inserts = {}
    if_absent: _Inserts = {}
    pending: dict[tuple[Table, Any], dict[str, Any]] = {}
    for n, op in enumerate(batch):
        if isinstance(op, _Insert):
            pk = next(iter(op.table.primary_key.columns)).key
            key = op.row.get(pk, n)  # autoincrement rows have no key yet: never updated here
            if op.if_absent:
                if_absent.setdefault(op.table.name, {}).setdefault(key, dict(op.row))
            else:
                inserts.setdefault(op.table.name, {})[key] = dict(op.row)
            continue
        new_row = inserts.get(op.table.name, {}).get(op.key)
        if new_row is not None:
            new_row.update(op.values)
        else:
            pending.setdefault((op.table, op.key), {}).update(op.values)
    updates: _Updates = {}
    for (table, key), values in pending.items():
        updates.setdefault((table, tuple(sorted(values))), []).append({**values, "_key": key})
    return inserts, if_absent, updates
