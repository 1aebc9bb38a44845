"""Sessions filtered, sorted and paged in the database, so a console can page through
every session (not a window of the newest) in any order it offers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from db import models
from db.repositories import as_dict

# the orders GET /v1/sessions offers: a column of sessions, or its program count
SESSION_SORTS = ("created_at", "updated_at", "id", "tenant", "priority", "programs")


@dataclass(frozen=True)
class SessionQuery:
    contains: str = ""  # in the id, any case
    tenant: str = ""  # exactly
    sort: str = "created_at"
    descending: bool = True


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
        where.append(models.Session.id.icontains(query.contains, autoescape=True))
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
