"""Reads of content tracing's records: a request's stored content, token totals summed
in the store (per model, so a price table can cost them), and a session's whole record
for an export."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from db import models
from db.repositories import as_dict


async def get_content(s: AsyncSession, request_id: str) -> dict[str, Any] | None:
    row = await s.get(models.RequestContent, request_id)
    return None if row is None else as_dict(row)


async def session_contents(s: AsyncSession, session_id: str, limit: int,
                           program_id: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """The session's stored contents (of one of its programs, `program_id`), the newest
    `limit` of them oldest first, each with its request's queue time, and how many."""
    c, r = models.RequestContent, models.Request
    where = [c.session_id == session_id]
    if program_id is not None:
        where.append(c.program_id == program_id)
    total = await s.scalar(select(func.count()).select_from(c).where(*where))
    rows = await s.execute(
        select(c, r.queued_at, r.model).join(r, r.id == c.request_id)
        .where(*where)
        .order_by(r.queued_at.desc(), r.id.desc()).limit(limit))
    out = [{**as_dict(row), "queued_at": queued, "model": model}
           for row, queued, model in rows.all()]
    return out[::-1], int(total or 0)


async def token_totals(s: AsyncSession, *where: ColumnElement[bool]
                       ) -> list[dict[str, Any]]:
    """Requests and their token sums per model, over the requests `where` selects."""
    r = models.Request
    rows = await s.execute(
        select(r.model, func.count(), func.coalesce(func.sum(r.prompt_tokens), 0),
               func.coalesce(func.sum(r.output_tokens), 0),
               func.coalesce(func.sum(r.cached_tokens), 0))
        .where(*where).group_by(r.model).order_by(r.model))
    return [{"model": m, "requests": n, "prompt_tokens": int(p), "completion_tokens": int(c),
             "cached_tokens": int(k)} for m, n, p, c, k in rows.all()]


async def session_totals(s: AsyncSession, session_id: str) -> list[dict[str, Any]]:
    return await token_totals(s, models.Request.session_id == session_id)


async def program_totals(s: AsyncSession, program_id: str) -> list[dict[str, Any]]:
    return await token_totals(s, models.Request.program_id == program_id)


async def tenant_totals(s: AsyncSession, tenant: str | None
                        ) -> dict[str, list[dict[str, Any]]]:
    """Per tenant (the sessions' tenant), per model; `tenant` None: every tenant."""
    r, sess = models.Request, models.Session
    query = (select(sess.tenant, r.model, func.count(),
                    func.coalesce(func.sum(r.prompt_tokens), 0),
                    func.coalesce(func.sum(r.output_tokens), 0),
                    func.coalesce(func.sum(r.cached_tokens), 0))
             .join(sess, sess.id == r.session_id)
             .group_by(sess.tenant, r.model).order_by(sess.tenant, r.model))
    if tenant is not None:
        query = query.where(sess.tenant == tenant)
    out: dict[str, list[dict[str, Any]]] = {}
    for t, m, n, p, c, k in (await s.execute(query)).all():
        out.setdefault(t, []).append({
            "model": m, "requests": n, "prompt_tokens": int(p), "completion_tokens": int(c),
            "cached_tokens": int(k)})
    return out


async def session_record(s: AsyncSession, session_id: str,
                         max_events: int) -> dict[str, Any] | None:
    """The session, its programs, their requests each with its content (None where none
    is stored), and its trace events (the first `max_events`), all oldest first."""
    row = await s.get(models.Session, session_id)
    if row is None:
        return None
    programs = await s.scalars(select(models.Program)
                               .where(models.Program.session_id == session_id)
                               .order_by(models.Program.created_at, models.Program.id))
    rows = await s.execute(
        select(models.Request, models.RequestContent)
        .outerjoin(models.RequestContent,
                   models.RequestContent.request_id == models.Request.id)
        .where(models.Request.session_id == session_id)
        .order_by(models.Request.queued_at, models.Request.id))
    events = await s.scalars(select(models.TraceEvent)
                             .where(models.TraceEvent.session_id == session_id)
                             .order_by(models.TraceEvent.id).limit(max_events + 1))
    trace = [as_dict(e) for e in events]
    return {
        "session": as_dict(row),
        "programs": [as_dict(p) for p in programs],
        "requests": [{**as_dict(req), "content": None if c is None else as_dict(c)}
                     for req, c in rows.all()],
        "trace": trace[:max_events],
        "trace_truncated": len(trace) > max_events,
    }
