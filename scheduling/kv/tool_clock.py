"""When agentd itself ran a program's tool: start and end of each call, for the KV view.

A program is ACTING between its LLM requests. For a gateway client the daemon only sees
that gap; when agentd runs the tool (the exec endpoint, a workflow run's tool call) it
knows when the tool started and when it ended, so the KV layer can decay a program's
weight from the real tool start, know that a tool is still running, and predict tool
time from measured durations instead of request gaps.

Overlapping calls of one program count as one span, from the first start to the last
end: the program is away from the GPU for all of it, and that is what the KV layer
weighs. Times are wall-clock seconds passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass


@dataclass
class ToolClock:
    running: int = 0  # calls in flight
    started_at: float | None = None  # start of the current span, or of the last one
    ended_at: float | None = None  # end of the last finished span
    last_s: float | None = None  # duration of the last finished span
    total_s: float = 0.0
    count: int = 0  # finished spans

    @property
    def mean_s(self) -> float | None:
        return self.total_s / self.count if self.count else None

    def key(self) -> tuple[object, ...]:
        """Every field a program view reads, for the view cache."""
        return (self.running > 0, self.started_at, self.ended_at, self.count)


class ToolClocks:
    def __init__(self) -> None:
        self._clocks: dict[str, ToolClock] = {}

    def get(self, program_id: str) -> ToolClock | None:
        return self._clocks.get(program_id)

    def count(self) -> int:
        """Programs with a clock: none while agentd runs no tool (the view skips lookups)."""
        return len(self._clocks)

    def started(self, program_id: str, now: float) -> None:
        clock = self._clocks.setdefault(program_id, ToolClock())
        if clock.running == 0:
            clock.started_at = now
        clock.running += 1

    def ended(self, program_id: str, now: float) -> float | None:
        """Close one call; returns the span's duration when it was the last one running.
        An end without a start (the program was forgotten in between) is ignored."""
        clock = self._clocks.get(program_id)
        if clock is None or clock.running == 0 or clock.started_at is None:
            return None
        clock.running -= 1
        if clock.running:
            return None
        duration = max(now - clock.started_at, 0.0)
        clock.ended_at, clock.last_s = now, duration
        clock.total_s += duration
        clock.count += 1
        return duration

    def forget_except(self, live: Container[str]) -> None:
        for pid in [pid for pid in self._clocks if pid not in live]:
            del self._clocks[pid]
