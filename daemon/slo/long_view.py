"""The meta loop's long view (V_long), built in small steps between dispatches.

Building V_long walks every completion of the long window: tens of ms of CPU at 30,000
completions, and in one piece on the event loop every dispatch waits behind it. A worker
thread does not help: it holds the GIL for the interpreter's switch interval (5 ms) each
time the loop wants it back, so dispatches still wait, in 5 ms bites. So the loop copies
the windows (`ViewBuilder.frozen()`, under a millisecond at that size) and walks the copy
itself, `LONG_VIEW_STEP` completions at a time (about a millisecond), yielding to every
dispatch between two steps; the meta loop's choice waits until the view lands, and
cycles in between run the rollback and bypass guards alone. A choice never rests on a
view taken more than one meta interval before it. The latest view is also what the
status and the metrics show, with the time it was taken, so no reader builds one at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from daemon.policies.loop_hold import stepped
from scheduling.slo.views import LongView, ViewBuilder

T = TypeVar("T")

log = logging.getLogger("agentd.slo")


@dataclass(frozen=True, slots=True)
class Built:
    taken_at: float  # wall time of the copy the view was built from
    view: LongView
    build_ms: float


class SteppedLongView:
    """Builds V_long in steps between dispatches, one build at a time. `latest` is the newest view;
    `fresh(now)` the one a choice may still use (not used yet, at most `max_age_s` old)."""

    def __init__(self, views: ViewBuilder, max_age_s: float,
                 on_built: Callable[[], None] = lambda: None) -> None:
        self.views, self.max_age_s, self.on_built = views, max_age_s, on_built
        self.latest: Built | None = None
        self._unused: Built | None = None
        self._task: asyncio.Task[None] | None = None
        self.builds = self.skipped = self.stale = self.failed = 0

    @property
    def in_flight(self) -> bool:
        return self._task is not None

    def fresh(self, now: float) -> LongView | None:
        built = self._unused
        if built is None:
            return None
        if now - built.taken_at > self.max_age_s:
            self._unused = None
            self.stale += 1
            return None
        return built.view

    def used(self) -> None:
        self._unused = None

    def outdated(self, now: float) -> bool:
        """Whether readers see a view older than one interval (or none)."""
        return self.latest is None or now - self.latest.taken_at > self.max_age_s

    def request(self, now: float) -> None:
        """Build a view of the windows as they are at `now`; while the previous build is
        still running this is skipped (and counted), so builds never pile up."""
        if self._task is not None:
            self.skipped += 1
            return
        frozen = self.views.frozen()
        self._task = asyncio.get_running_loop().create_task(
            self._build(frozen, now), name="slo-long-view")

    async def settled(self) -> None:
        """Wait for the build in flight, if any (and for `on_built` to have run)."""
        task = self._task
        if task is not None:
            await asyncio.shield(task)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _build(self, frozen: ViewBuilder, taken_at: float) -> None:
        started = time.perf_counter()
        try:
            view = await stepped(frozen.long_view_steps(taken_at))
        except Exception:
            self.failed += 1
            log.exception("building the SLO long view failed")
            return
        finally:
            if self._task is asyncio.current_task():
                self._task = None
        self.builds += 1
        self.latest = self._unused = Built(taken_at, view,
                                           (time.perf_counter() - started) * 1000)
        try:
            self.on_built()
        except Exception:  # the next cycle retries the choice with this view
            log.exception("applying the SLO long view failed")

    def status(self, now: float) -> dict[str, Any]:
        built = self.latest
        return {"taken_at": built.taken_at if built else None,
                "age_s": round(now - built.taken_at, 3) if built else None,
                "build_ms": round(built.build_ms, 1) if built else None,
                "builds": self.builds, "skipped": self.skipped, "stale": self.stale,
                "failed": self.failed, "in_flight": self.in_flight}
