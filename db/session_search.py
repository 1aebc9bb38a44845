"""Sessions filtered, sorted and paged in the database, so a console can page through
every session (not a window of the newest) in any order it offers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, String, and_, cast, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from db import models
from db.repositories import as_dict

# the orders GET /v1/sessions offers: a column of sessions, or its program count
SESSION_SORTS = ("created_at", "updated_at", "id", "tenant", "priority", "programs")


@dataclass(frozen=True)
class SessionQuery:
    # in the id, or in a stored prompt, completion or tool call of one of its requests
    # (content tracing), any case
    contains: str = ""
    tenant: str = ""  # exactly
    sort: str = "created_at"
    descending: bool = True
    # active in [since, until]: created, or a request queued, in it (unix seconds)
    since: float | None = None
    until: float | None = None
    status: str = ""  # holding a program in this status, exactly


async def search_sessions(
    s: AsyncSession, query: SessionQuery, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    """One page of the sessions `query` selects, each with its program count, and how
    many it selects in all."""
    if query.sort not in SESSION_SORTS:
        raise ValueError(f"sort must be one of {', '.join(SESSION_SORTS)}")
    counts = (
        select(models.Program.session_id, func.count().label("programs"))
        .group_by(models.Program.session_id)
        .subquery()
    )
    programs = func.coalesce(counts.c.programs, 0)
    where = []
    if query.contains:
        where.append(or_(models.Session.id.icontains(query.contains, autoescape=True),
                         _content_contains(query.contains)))
    if query.status:
        p = models.Program
        where.append(exists().where(p.session_id == models.Session.id,
                                    p.status == query.status))
    if query.since is not None or query.until is not None:
        where.append(_active_between(query.since, query.until))
    if query.tenant:
        where.append(models.Session.tenant == query.tenant)
    total = await s.scalar(select(func.count()).select_from(models.Session).where(*where))
    key = programs if query.sort == "programs" else getattr(models.Session, query.sort)
    # the id breaks ties, so pages neither repeat nor skip rows with equal keys
    order = [key.desc(), models.Session.id.desc()] if query.descending \
        else [key.asc(), models.Session.id.asc()]
    rows = await s.execute(
        select(models.Session, programs)
        .outerjoin(counts, counts.c.session_id == models.Session.id)
        .where(*where)
        .order_by(*order)
        .limit(limit)
        .offset(offset)
    )
    return [{**as_dict(sess), "programs": n} for sess, n in rows.all()], int(total or 0)


def _content_contains(text: str) -> ColumnElement[bool]:
    """A request of the session stored content holding `text` (LIKE, any case). The JSON
    columns are read as their text, so a prompt's message or a call's arguments match."""
    c = models.RequestContent
    return exists().where(
        c.session_id == models.Session.id,
        or_(c.completion.icontains(text, autoescape=True),
            cast(c.prompt, String).icontains(text, autoescape=True),
            cast(c.tool_calls, String).icontains(text, autoescape=True)))


def _active_between(since: float | None, until: float | None) -> ColumnElement[bool]:
    def within(column: ColumnElement[float] | Any) -> ColumnElement[bool]:
        bounds = []
        if since is not None:
            bounds.append(column >= since)
        if until is not None:
            bounds.append(column <= until)
        return and_(*bounds)

    r = models.Request
    return or_(within(models.Session.created_at),
               exists().where(r.session_id == models.Session.id, within(r.queued_at)))
