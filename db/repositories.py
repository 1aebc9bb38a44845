"""Read queries the API serves; each returns plain dicts ready for JSON."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from db import models


def as_dict(row: models.Base) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in row.__table__.columns}


PROGRAM_SORTS = ("created_at", "id", "session_id", "status", "worker_id", "context_tokens",
                 "steps")


async def list_programs(
    s: AsyncSession, status: str | None, session_id: str | None, limit: int, offset: int,
    sort: str = "created_at", descending: bool = True, tenant: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """One page of programs in `sort` order over every match; ties by id so pages are
    stable. `tenant`: only programs of that tenant's sessions."""
    if sort not in PROGRAM_SORTS:
        raise ValueError(f"sort must be one of {', '.join(PROGRAM_SORTS)}")
    query = select(models.Program)
    if tenant is not None:
        query = query.join(models.Session, models.Session.id == models.Program.session_id
                           ).where(models.Session.tenant == tenant)
    if status:
        query = query.where(models.Program.status == status.upper())
    if session_id:
        query = query.where(models.Program.session_id == session_id)
    total = await s.scalar(select(func.count()).select_from(query.subquery()))
    column = getattr(models.Program, sort)
    key = column.desc() if descending else column.asc()
    tie = models.Program.id.desc() if descending else models.Program.id.asc()
    rows = await s.scalars(
        query.order_by(key.nulls_last(), tie).limit(limit).offset(offset)
    )
    return [as_dict(r) for r in rows], int(total or 0)


async def get_program(s: AsyncSession, program_id: str) -> dict[str, Any] | None:
    row = await s.get(models.Program, program_id)
    if row is None:
        return None
    out = as_dict(row)
    reqs = await s.scalars(
        select(models.Request)
        .where(models.Request.program_id == program_id)
        .order_by(models.Request.queued_at)
    )
    out["requests"] = [as_dict(r) for r in reqs]
    return out


async def get_session(s: AsyncSession, session_id: str) -> dict[str, Any] | None:
    row = await s.get(models.Session, session_id)
    if row is None:
        return None
    out = as_dict(row)
    programs = await s.scalars(
        select(models.Program)
        .where(models.Program.session_id == session_id)
        .order_by(models.Program.created_at)
    )
    out["programs"] = [as_dict(p) for p in programs]
    return out


async def trace_events(
    s: AsyncSession, session_id: str, after_id: int, limit: int
) -> list[dict[str, Any]]:
    rows = await s.scalars(
        select(models.TraceEvent)
        .where(models.TraceEvent.session_id == session_id, models.TraceEvent.id > after_id)
        .order_by(models.TraceEvent.id)
        .limit(limit)
    )
    return [as_dict(r) for r in rows]


async def get_request(s: AsyncSession, request_id: str) -> dict[str, Any] | None:
    row = await s.get(models.Request, request_id)
    return None if row is None else as_dict(row)


async def get_worker(s: AsyncSession, worker_id: str) -> dict[str, Any] | None:
    """The worker's row while this daemon knows it (a restart clears the table)."""
    row = await s.get(models.Worker, worker_id)
    return None if row is None else as_dict(row)


async def worker_requests(s: AsyncSession, worker_id: str, limit: int,
                          tenant: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """The newest requests that ran on `worker_id` and how many there are in all;
    `tenant`: only requests of that tenant's sessions."""
    query = select(models.Request).where(models.Request.worker_id == worker_id)
    if tenant is not None:
        query = query.join(models.Session, models.Session.id == models.Request.session_id
                           ).where(models.Session.tenant == tenant)
    total = await s.scalar(select(func.count()).select_from(query.subquery()))
    rows = await s.scalars(query.order_by(models.Request.queued_at.desc(),
                                          models.Request.id.desc()).limit(limit))
    return [as_dict(r) for r in rows], int(total or 0)
