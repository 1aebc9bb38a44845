"""Read queries the API serves; each returns plain dicts ready for JSON."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from db import models


def as_dict(row: models.Base) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in row.__table__.columns}


async def list_programs(
    s: AsyncSession, status: str | None, session_id: str | None, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    query = select(models.Program)
    if status:
        query = query.where(models.Program.status == status.upper())
    if session_id:
        query = query.where(models.Program.session_id == session_id)
    total = await s.scalar(select(func.count()).select_from(query.subquery()))
    rows = await s.scalars(
        query.order_by(models.Program.created_at.desc()).limit(limit).offset(offset)
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
