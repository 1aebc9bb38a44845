"""The daemon's history at run time: a sample of its own series every
`history_interval_s` into the store through the batched writer, the event log flushed
with it, and every minute the rollup and prune of each tier, done in the store
(daemon/history/store.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from daemon.history import tiers as tiering
from daemon.history.events import EventLog
from daemon.history.http_tally import HttpTally
from daemon.history.sampler import Ended, Gauges, IntervalStats
from daemon.history.store import HistoryStore
from daemon.history.tiers import Point
from daemon.state import ProgramStatus, RequestState, RequestStatus

if TYPE_CHECKING:
    from daemon.core.core import Core
    from daemon.workers.protocol import Finish

log = logging.getLogger("agentd.history")

MAINTAIN_EVERY_S = 60.0
EVENTS_FOLD_S = 10.0


class History:
    def __init__(self, core: Core, tally: HttpTally,
                 clock: Callable[[], float] | None = None) -> None:
        cfg = core.config
        self.core = core
        self.clock = clock or core.clock
        self.interval_s = cfg.history_interval_s
        self.store = HistoryStore(
            core.sessions, core.writer,
            tiering.tiers_of(cfg.history_raw_keep_s, cfg.history_minute_keep_s,
                             cfg.history_ten_minute_keep_s),
            cfg.history_interval_s, cfg.history_events_keep_s, self.clock)
        self.tally = tally
        self.pauses = 0  # the KV policy's pauses, counted from their trace events
        # The counters are this process's, from zero: the first interval's rates count
        # from the start (a storm before the first sample is not lost).
        self.stats = IntervalStats(self.clock(), last=self.gauges())
        self.events = EventLog(lambda row: core.writer.insert("events", row), self.clock)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.core.writer.trace_observers += [self.events.observe, self._count_pauses]
        self.tally.on_error = self.events.http_answer
        self.core.on_request_end.append(self._request_ended)
        self._tasks = [asyncio.create_task(self._sample_loop(), name="history-sample"),
                       asyncio.create_task(self._maintain_loop(), name="history-rollup")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.events.flush()  # the writer commits them as it stops

    # --- sampling -------------------------------------------------------------------

    def _request_ended(self, req: RequestState, _finish: Finish | None) -> None:
        if req.status == RequestStatus.ABORTED:
            return
        ttft = tpot = None
        if req.first_token_at is not None:
            ttft = req.first_token_at - req.queued_at
            if req.finished_at is not None and req.output_tokens > 1:
                tpot = (req.finished_at - req.first_token_at) / (req.output_tokens - 1)
        self.stats.on_end(Ended(req.status == RequestStatus.FINISHED, req.output_tokens,
                                ttft, tpot))

    def _count_pauses(self, row: dict[str, object]) -> None:
        self.pauses += row["kind"] == "kv.pause"

    def gauges(self) -> Gauges:
        core = self.core
        kv = {}
        for w in core.workers.values():
            s = w.stats
            if w.status != "gone" and s is not None and s.kv_capacity_tokens:
                kv[w.id] = 100.0 * s.kv_used_tokens / s.kv_capacity_tokens
        return Gauges(
            kv_used_pct=kv, queue_length=len(core.queue),
            paused_programs=sum(p.status == ProgramStatus.PAUSED
                                for p in core.programs.values()),
            healthy_workers=sum(w.healthy for w in core.workers.values()),
            good_total=core.slo.stats.met, refused_total=core.slo.stats.refusals,
            http_5xx_total=self.tally.errors_5xx, pauses_total=self.pauses)

    def sample(self) -> list[Point]:
        """Take one sample and queue it (with the folded events) on the writer."""
        points = self.stats.take(self.clock(), self.gauges())
        self.store.add(points)
        self.events.flush()
        return points

    async def _sample_loop(self) -> None:
        while True:  # with sampling off, the event log still folds at the default period
            await asyncio.sleep(self.interval_s or EVENTS_FOLD_S)
            try:
                if self.interval_s > 0:
                    self.sample()
                else:
                    self.events.flush()
            except Exception:  # the next interval tries again
                log.exception("history sample failed")

    async def _maintain_loop(self) -> None:
        while True:
            await asyncio.sleep(MAINTAIN_EVERY_S)
            try:
                await self.store.maintain()
            except Exception:  # e.g. the store busy: the next round folds what is due
                log.exception("history rollup failed")
