"""The store's side of the daemon's history (daemon/history/): its sampled series by
tier and its event log. Reads return plain dicts; the rollup's steps run in the caller's
transaction, so a fold and the prune after it land together or not at all."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, case, delete, func, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from db import models

P = models.HistoryPoint
E = models.OperatorEvent


class whole_part(FunctionElement[int]):
    """The whole part of a non-negative number, as an integer. CAST alone will not do on
    both databases: SQLite's truncates, PostgreSQL's rounds (a bucket would take the
    second half of its neighbour)."""

    type = BigInteger()
    inherit_cache = True


@compiles(whole_part)
def _whole_part(element: whole_part, compiler: SQLCompiler, **kw: object) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS BIGINT)"


@compiles(whole_part, "postgresql")
def _whole_part_pg(element: whole_part, compiler: SQLCompiler, **kw: object) -> str:
    return f"CAST(FLOOR({compiler.process(element.clauses, **kw)}) AS BIGINT)"


async def points(s: AsyncSession, step_s: int, since: float, until: float,
                 series: list[str] | None = None) -> list[dict[str, Any]]:
    """The tier's points in [since, until], oldest first."""
    query = select(P.series, P.label, P.ts, P.value, P.samples).where(
        P.step_s == step_s, P.ts >= since, P.ts <= until)
    if series:
        query = query.where(P.series.in_(series))
    rows = await s.execute(query.order_by(P.ts, P.id))
    return [dict(r._mapping) for r in rows]


async def bucketed(s: AsyncSession, step_s: int, since: float, until: float,
                   bucket_s: int, series: list[str] | None, worst_of: list[str]
                   ) -> list[dict[str, Any]]:
    """The tier's points in [since, until] folded in the store into buckets of `bucket_s`
    (each stamped with its start): the mean weighted by samples, or the largest value for
    the series in `worst_of`; oldest first."""
    bucket = (whole_part(P.ts / bucket_s) * bucket_s).label("ts")
    mean = func.sum(P.value * P.samples) / func.sum(P.samples)
    value = case((P.series.in_(worst_of), func.max(P.value)), else_=mean).label("value")
    query = select(P.series, P.label, bucket, value, func.sum(P.samples).label("samples")
                   ).where(P.step_s == step_s, P.ts >= since, P.ts <= until)
    if series:
        query = query.where(P.series.in_(series))
    rows = await s.execute(query.group_by(P.series, P.label, bucket).order_by(bucket))
    return [dict(r._mapping) for r in rows]


async def newest(s: AsyncSession, step_s: int) -> float | None:
    """The newest point's time in the tier (for a rollup tier: its last bucket's start)."""
    value = await s.scalar(select(func.max(P.ts)).where(P.step_s == step_s))
    return None if value is None else float(value)


async def oldest(s: AsyncSession, step_s: int) -> float | None:
    value = await s.scalar(select(func.min(P.ts)).where(P.step_s == step_s))
    return None if value is None else float(value)


async def add_points(s: AsyncSession, step_s: int, rows: list[dict[str, Any]]) -> None:
    if rows:
        await s.execute(insert(P), [{**r, "step_s": step_s} for r in rows])


async def prune_points(s: AsyncSession, step_s: int, before: float) -> int:
    done = await s.execute(delete(P).where(P.step_s == step_s, P.ts < before))
    return int(getattr(done, "rowcount", 0) or 0)


async def prune_events(s: AsyncSession, before: float) -> int:
    done = await s.execute(delete(E).where(E.ts < before))
    return int(getattr(done, "rowcount", 0) or 0)


async def events(s: AsyncSession, since: float, kinds: list[str] | None, limit: int,
                 tenant: str | None = None, visible_cluster: bool = True
                 ) -> list[dict[str, Any]]:
    """The newest events since `since`, newest first. `tenant`: only that tenant's rows,
    plus the rows of no tenant when `visible_cluster`."""
    query = select(E).where(E.last_ts >= since)
    if kinds:
        query = query.where(E.kind.in_(kinds))
    if tenant is not None:
        mine = E.tenant == tenant
        query = query.where(or_(mine, E.tenant.is_(None)) if visible_cluster else mine)
    rows = await s.scalars(query.order_by(E.ts.desc(), E.id.desc()).limit(limit))
    return [{c.key: getattr(r, c.key) for c in E.__table__.columns} for r in rows]
