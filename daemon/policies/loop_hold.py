"""How long a registry call holds the event loop.

A coroutine holds the loop from one suspension to the next: during such a step nothing
else on the loop runs, so no request is dispatched. `held(coro)` awaits `coro` step by
step and keeps its longest step, in wall time (what a dispatch waits) and, less garbage
collection (daemon/policies/clock.py), in wall and in the loop thread's CPU time: a
collection pauses the whole process wherever it lands, and on a shared machine the
thread can be descheduled mid-step, which says nothing about the call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from daemon.policies.clock import cpu_time, wall_time

log = logging.getLogger("agentd.policies")
T = TypeVar("T")

# Issue 8's target: no dispatch stall over 10 ms during a swap.
LOOP_HOLD_BUDGET_S = 0.010


@dataclass
class Hold:
    """The longest step of one call, in seconds."""

    steps: int = 0
    wall_s: float = 0.0
    wall_less_gc_s: float = 0.0
    cpu_less_gc_s: float = 0.0

    def add(self, wall: float, wall_less_gc: float, cpu_less_gc: float) -> None:
        self.steps += 1
        self.wall_s = max(self.wall_s, wall)
        self.wall_less_gc_s = max(self.wall_less_gc_s, wall_less_gc)
        self.cpu_less_gc_s = max(self.cpu_less_gc_s, cpu_less_gc)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "wall_ms": _ms(self.wall_s),
                "wall_less_gc_ms": _ms(self.wall_less_gc_s),
                "cpu_less_gc_ms": _ms(self.cpu_less_gc_s)}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class _Stepped:
    """Awaitable that drives a coroutine as `await` would, timing each step."""

    def __init__(self, coro: Coroutine[Any, Any, Any], hold: Hold) -> None:
        self.coro, self.hold = coro, hold

    def _step(self, value: Any, error: BaseException | None) -> Any:
        marks = (time.perf_counter(), wall_time(), cpu_time())
        try:
            return self.coro.throw(error) if error is not None else self.coro.send(value)
        finally:
            self.hold.add(time.perf_counter() - marks[0], wall_time() - marks[1],
                          cpu_time() - marks[2])

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = self._step(value, error)
            except StopIteration as stop:
                return stop.value
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # thrown into the task (a cancel): pass it on
                value, error = None, exc


async def held(coro: Coroutine[Any, Any, T]) -> tuple[T, Hold]:
    """Await `coro`; its value and the longest stretch it held the loop."""
    hold = Hold()
    value: T = await _Stepped(coro, hold)
    return value, hold


async def with_hold(what: str, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """`coro`'s answer with its `loop_hold`; a hold over the budget is logged."""
    answer, hold = await held(coro)
    if hold.cpu_less_gc_s > LOOP_HOLD_BUDGET_S:
        log.warning("%s held the event loop for %.1f ms of CPU (budget %.0f ms)", what,
                    hold.cpu_less_gc_s * 1000, LOOP_HOLD_BUDGET_S * 1000)
    return {**answer, "loop_hold": hold.to_dict()}
