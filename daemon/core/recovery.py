"""Crash recovery: settle what the previous daemon run left in flight, before serving.

The in-memory state (daemon/state.py) dies with the process; the store keeps its last
flush. At start nothing is running yet, so every program still REASONING, QUEUED or
PAUSED and every request still queued or running was interrupted by the restart:

- programs go to ACTING ("daemon restarted: request interrupted"): their next request
  continues them, as for a gateway client that retries;
- requests are marked failed ("interrupted by a daemon restart"). No client was answered
  for any of them: the gateway sends a completion (or a stream's final chunk) only once
  the request's finish is committed (`_finish_recorded` in daemon/api/gateway.py), and
  the finish moves the row out of queued/running. A request that finished but whose
  answer had not gone out yet is found finished or failed, depending on that commit;
- each affected session gets a `daemon.recovered` trace event that marks the gap, from
  its last event before the restart to the restart time;
- worker rows are cleared: they describe the live pool, which is empty until the
  workers register again (their history stays in the trace).

`recover()` also says whether the previous run crashed: a clean stop writes
`daemon.stopped`, so a last daemon-level event of `daemon.started` means it did not.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from daemon.state import ProgramStatus, RequestStatus
from db import models
from db.writer import BatchWriter

PROGRAM_REASON = "daemon restarted: request interrupted"
REQUEST_ERROR = "interrupted by a daemon restart"
INTERRUPTED_PROGRAMS = (ProgramStatus.REASONING, ProgramStatus.QUEUED, ProgramStatus.PAUSED)
INTERRUPTED_REQUESTS = (RequestStatus.QUEUED, RequestStatus.RUNNING)
_LIFECYCLE = ("daemon.started", "daemon.stopped")


@dataclass
class Recovery:
    """What the start found; `started_fields()` goes on the `daemon.started` event."""

    restarted_at: float
    after_crash: bool
    last_event_at: float | None
    programs: dict[str, list[str]] = field(default_factory=dict)  # session -> program ids
    requests: dict[str, list[str]] = field(default_factory=dict)  # session -> request ids

    def started_fields(self) -> dict[str, Any]:
        return {
            "after_crash": self.after_crash, "last_event_at": self.last_event_at,
            "programs_interrupted": sum(len(p) for p in self.programs.values()),
            "requests_interrupted": sum(len(r) for r in self.requests.values()),
        }


async def recover(sessions: async_sessionmaker[Any], writer: BatchWriter) -> Recovery:
    """Settle the previous run's leftovers in one transaction and trace the gaps."""
    now = time.time()
    async with sessions() as s, s.begin():
        found = Recovery(now, await _crashed(s), await _last_event_at(s, None))
        found.programs = await _interrupt_programs(s, now)
        found.requests = await _fail_requests(s, now)
        await s.execute(delete(models.Worker))
        gaps = {sid: await _last_event_at(s, sid) for sid in {*found.programs, *found.requests}}
    for sid, gap_from in sorted(gaps.items()):
        writer.trace(
            "daemon.recovered", session_id=sid, gap_from=gap_from, gap_to=now,
            after_crash=found.after_crash, programs=found.programs.get(sid, []),
            requests=found.requests.get(sid, []), reason=PROGRAM_REASON,
        )
    return found


async def _crashed(s: AsyncSession) -> bool:
    last = await s.scalar(
        select(models.TraceEvent.kind).where(models.TraceEvent.kind.in_(_LIFECYCLE))
        .order_by(models.TraceEvent.id.desc()).limit(1))
    return last == "daemon.started"


async def _last_event_at(s: AsyncSession, session_id: str | None) -> float | None:
    query = select(func.max(models.TraceEvent.ts))
    if session_id is not None:
        query = query.where(models.TraceEvent.session_id == session_id)
    value = await s.scalar(query)
    return None if value is None else float(value)


async def _interrupt_programs(s: AsyncSession, now: float) -> dict[str, list[str]]:
    stale = [p.value for p in INTERRUPTED_PROGRAMS]
    rows = (await s.execute(select(models.Program.id, models.Program.session_id)
                            .where(models.Program.status.in_(stale)))).all()
    await s.execute(update(models.Program).where(models.Program.status.in_(stale)).values(
        status=ProgramStatus.ACTING.value, status_reason=PROGRAM_REASON, status_since=now))
    return _by_session(rows)


async def _fail_requests(s: AsyncSession, now: float) -> dict[str, list[str]]:
    stale = [r.value for r in INTERRUPTED_REQUESTS]
    rows = (await s.execute(select(models.Request.id, models.Request.session_id)
                            .where(models.Request.status.in_(stale)))).all()
    await s.execute(update(models.Request).where(models.Request.status.in_(stale)).values(
        status=RequestStatus.FAILED.value, finish_reason="error", error=REQUEST_ERROR,
        finished_at=now))
    return _by_session(rows)


def _by_session(rows: Any) -> dict[str, list[str]]:
    out: defaultdict[str, list[str]] = defaultdict(list)
    for item_id, session_id in rows:
        out[session_id].append(item_id)
    return dict(out)
