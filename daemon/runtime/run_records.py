"""Ended runs that have left the daemon's memory (see RunController.retire), or that an
earlier daemon process ran: their views come from the record each run writes at its end
(`<data dir>/runs/<id>.json`), their events from the trace store, where every event of a
run was written with its `run_id`. Files are read off the event loop.

A record carries its run's result, at most `max_result_bytes` of it since there is a cap
(daemon/runtime/runs.py); records written before hold any size, so `trim_results` drops
the larger results from them once, at start."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db import models

RUN_ID = re.compile(r"run-[0-9a-f]{16}")
# What GET /v1/runs adds from the records, newest first, to the runs in memory.
LISTED_RECORDS = 200


def _read(path: Path) -> dict[str, Any] | None:
    try:
        view = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return view if isinstance(view, dict) else None


async def recorded(records: Path, run_id: str) -> dict[str, Any] | None:
    """The view of an ended run from its record; None for no record or no run id."""
    if not RUN_ID.fullmatch(run_id):
        return None
    return await asyncio.to_thread(_read, records / f"{run_id}.json")


def _newest(records: Path, skip: set[str], limit: int) -> list[dict[str, Any]]:
    try:
        entries = [e for e in records.iterdir()
                   if e.suffix == ".json" and RUN_ID.fullmatch(e.stem) and e.stem not in skip]
    except OSError:
        return []
    entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    views = [_read(e) for e in entries[:limit]]
    return [v for v in views if v is not None]


async def newest(records: Path, skip: set[str], limit: int = LISTED_RECORDS
                 ) -> list[dict[str, Any]]:
    """Views of the most recently ended runs on record, except those in `skip`."""
    return await asyncio.to_thread(_newest, records, skip, limit)


def _trim(path: Path, max_result_bytes: int) -> bool:
    """Drop the record's result when larger than the cap; its mtime (the list's order)
    stays. Whether it did."""
    view = _read(path)
    if view is None:
        return False
    size = len(json.dumps(view.get("result"), default=repr))
    if size <= max_result_bytes:
        return False
    view["result"] = None
    view["error"] = {"kind": "system",
                     "reason": f"result too large: its {size} bytes of JSON were dropped from "
                               f"this record (max_result_bytes {max_result_bytes})"}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        st = path.stat()
        tmp.write_text(json.dumps(view))
        os.replace(tmp, path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError:
        return False  # kept as it was; the next start tries again
    return True


def _trim_all(records: Path, max_result_bytes: int) -> int:
    try:
        # a record no larger than the cap cannot hold a result over it: not read
        large = [e for e in records.iterdir() if e.suffix == ".json"
                 and RUN_ID.fullmatch(e.stem) and e.stat().st_size > max_result_bytes]
    except OSError:
        return 0
    return sum(_trim(e, max_result_bytes) for e in large)


async def trim_results(records: Path, max_result_bytes: int) -> int:
    """Drop results larger than `max_result_bytes` from the records (each says so in its
    error); how many records changed."""
    return await asyncio.to_thread(_trim_all, records, max_result_bytes)


async def stored_events(sessions: async_sessionmaker[AsyncSession], view: dict[str, Any],
                        limit: int) -> list[dict[str, Any]]:
    """The run's events as its live stream carried them, read back from the trace."""
    run_id = view["id"]
    async with sessions() as s:
        rows = await s.scalars(
            select(models.TraceEvent)
            .where(models.TraceEvent.program_id == view["program_id"])
            .order_by(models.TraceEvent.id))
        events = []
        for row in rows:
            data = dict(row.data or {})
            if data.pop("run_id", None) != run_id:
                continue  # the program's own events (status changes), not the run's
            events.append({"kind": row.kind, "ts": row.ts, "run_id": run_id,
                           "session_id": row.session_id, "program_id": row.program_id,
                           **data})
            if len(events) >= limit:
                break
        return events
