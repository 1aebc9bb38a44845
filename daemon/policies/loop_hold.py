"""How long a registry call holds the event loop.

A coroutine holds the loop from one suspension to the next: during such a step nothing
else on the loop runs, so no request is dispatched. `held(coro)` awaits `coro` step by
step and keeps its longest step, in wall time (what a dispatch waits) and, less garbage
collection (daemon/policies/clock.py), in wall and in the loop thread's CPU time: a
collection pauses the whole process wherever it lands, and on a shared machine the
thread can be descheduled mid-step, which says nothing about the call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from pathlib import Path
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
    # The CPU-longest step ran from the suspension point `cpu_step[0]` to `cpu_step[1]`
    # (file:line of the innermost awaiting frame; "start" / "end" at the call's edges).
    cpu_step: tuple[str, str] = ("start", "end")

    def add(self, wall: float, wall_less_gc: float, cpu_less_gc: float,
            step: tuple[str, str] | None = None) -> None:
        self.steps += 1
        self.wall_s = max(self.wall_s, wall)
        self.wall_less_gc_s = max(self.wall_less_gc_s, wall_less_gc)
        if cpu_less_gc > self.cpu_less_gc_s:
            self.cpu_less_gc_s = cpu_less_gc
            if step is not None:
                self.cpu_step = step

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "wall_ms": _ms(self.wall_s),
                "wall_less_gc_ms": _ms(self.wall_less_gc_s),
                "cpu_less_gc_ms": _ms(self.cpu_less_gc_s),
                "cpu_longest_step": f"{self.cpu_step[0]} -> {self.cpu_step[1]}"}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class _Stepped:
    """Awaitable that drives a coroutine as `await` would, timing each step."""

    def __init__(self, coro: Coroutine[Any, Any, Any], hold: Hold) -> None:
        self.coro, self.hold = coro, hold
        self.at = "start"

    def _step(self, value: Any, error: BaseException | None) -> Any:
        marks = (time.perf_counter(), wall_time(), cpu_time())
        ended = "end"
        try:
            out = self.coro.throw(error) if error is not None else self.coro.send(value)
            ended = _suspended_at(self.coro)
            return out
        finally:
            self.hold.add(time.perf_counter() - marks[0], wall_time() - marks[1],
                          cpu_time() - marks[2], (self.at, ended))
            self.at = ended

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


_OURS = str(Path(__file__).resolve().parents[2])


def _suspended_at(coro: Any) -> str:
    """Where a suspended coroutine waits: the innermost frame of this repository's code
    down its await chain (below it, the library's: SQLAlchemy, asyncio)."""
    where, obj = "?", coro
    while obj is not None:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            break
        name = frame.f_code.co_filename
        if name.startswith(_OURS) and "/.venv/" not in name:
            where = f"{name[len(_OURS) + 1:]}:{frame.f_lineno}"
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    return where


async def held(coro: Coroutine[Any, Any, T]) -> tuple[T, Hold]:
    """Await `coro`; its value and the longest stretch it held the loop."""
    hold = Hold()
    value: T = await _Stepped(coro, hold)
    return value, hold


async def with_hold(what: str, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """`coro`'s answer with its `loop_hold`; a hold over the budget is logged."""
    answer, hold = await held(coro)
    if hold.cpu_less_gc_s > LOOP_HOLD_BUDGET_S:
        log.warning("%s held the event loop for %.1f ms of CPU (budget %.0f ms), from %s "
                    "to %s", what, hold.cpu_less_gc_s * 1000, LOOP_HOLD_BUDGET_S * 1000,
                    *hold.cpu_step)
    return {**answer, "loop_hold": hold.to_dict()}


async def stepped(steps: Generator[None, None, T]) -> T:
    """Drive a stepped computation on the loop, letting everything ready run between two
    steps; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)
