"""The history's tiers in the store: rollup and retention every minute, and reads that
pick the tier a span needs. Async sessions only (one transaction per tier), so nothing
here blocks the event loop; samples themselves arrive through the batched writer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from daemon.history import tiers as tiering
from daemon.history.sampler import FOLD
from daemon.history.tiers import Point, Tier
from db import history_store as store
from db.writer import BatchWriter

# A bucket is folded this long after it ended, so a sample stamped just before its end and
# still in the writer's batch is in the store by then.
FOLD_LAG_S = 5.0


class HistoryStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], writer: BatchWriter,
                 tiers: tuple[Tier, ...], interval_s: float, events_keep_s: float,
                 clock: Callable[[], float]) -> None:
        self.sessions = sessions
        self.writer = writer
        self.tiers = tiers
        self.interval_s = interval_s
        self.events_keep_s = events_keep_s
        self.clock = clock

    def add(self, points: list[Point]) -> None:
        """Queue raw samples on the batched writer."""
        for p in points:
            self.writer.insert("history_points", _row(p, 0))

    async def maintain(self) -> None:
        """Fold each tier's complete buckets into the next, then prune every tier."""
        await self.writer.flush()
        now = self.clock()
        for finer, tier in zip(self.tiers, self.tiers[1:], strict=False):
            async with self.sessions.begin() as s:
                await _roll(s, finer, tier, now - FOLD_LAG_S)
        async with self.sessions.begin() as s:
            for tier in self.tiers:
                await store.prune_points(s, tier.step_s, now - tier.keep_s)
            await store.prune_events(s, now - self.events_keep_s)

    async def read(self, series: list[str] | None, since: float, until: float,
                   step_s: float) -> dict[str, Any]:
        """The series over [since, until] from the tier that holds it, about `step_s`
        apart; a rollup tier's newest, not yet folded span comes from the raw samples."""
        await self.writer.flush()
        tier = tiering.pick_tier(self.tiers, since, step_s, self.clock())
        native = tier.step_s or self.interval_s  # how far apart the tier's points are
        # coarser than stored: the store folds into the step asked for
        step = int(step_s) if step_s >= 2 * native else 0
        worst = [n for n, how in FOLD.items() if how == tiering.MAX]
        async with self.sessions() as s:
            if step:
                rows = await store.bucketed(s, tier.step_s, since, until, step, series, worst)
            else:
                rows = await store.points(s, tier.step_s, since, until, series)
            recent: list[dict[str, Any]] = []
            if tier.step_s:  # what the tier has not folded yet, from the raw samples
                folded_to = await store.newest(s, tier.step_s)
                start = since if folded_to is None else max(since, folded_to + tier.step_s)
                recent = await store.bucketed(s, 0, start, until, max(step, tier.step_s),
                                              series, worst)
        points = [_point(r) for r in rows] + [_point(r) for r in recent]
        if step and recent:  # the raw tail's last bucket may share one with the tier's
            points = tiering.fold(points, step, FOLD)
        return {"since": since, "until": until, "step_s": step or native,
                "tier_step_s": tier.step_s,
                "series": _grouped(points)}


async def _roll(s: AsyncSession, finer: Tier, tier: Tier, now: float) -> None:
    newest = await store.newest(s, tier.step_s)
    watermark = None if newest is None else newest + tier.step_s
    span = tiering.due_buckets(tier.step_s, watermark, await store.oldest(s, finer.step_s),
                               now)
    if span is None:
        return
    start, end = span
    rows = [r for r in await store.points(s, finer.step_s, start, end) if r["ts"] < end]
    folded = tiering.fold([_point(r) for r in rows], tier.step_s, FOLD)
    await store.add_points(s, tier.step_s, [_row(p, tier.step_s) for p in folded])


def _point(r: dict[str, Any]) -> Point:
    return Point(r["series"], r["label"], float(r["ts"]), float(r["value"]),
                 int(r.get("samples") or 1))


def _row(p: Point, step_s: int) -> dict[str, Any]:
    return {"series": p.series, "label": p.label, "step_s": step_s, "ts": p.ts,
            "value": p.value, "samples": p.samples}


def _grouped(points: list[Point]) -> list[dict[str, Any]]:
    out: dict[tuple[str, str], list[list[float]]] = {}
    for p in sorted(points, key=lambda p: p.ts):
        out.setdefault((p.series, p.label), []).append([p.ts, p.value])
    return [{"name": name, "label": label, "points": pts}
            for (name, label), pts in sorted(out.items())]
