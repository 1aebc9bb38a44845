"""A session's trace events as spans (queue wait, generation, pauses, migrations).

Pure functions of the API's event dicts, so the trace view and its tests share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from console.render import seconds, short_id

END_KINDS = ("request.finished", "request.failed", "request.aborted")
STYLES = {"queue": "yellow", "generate": "green", "paused": "magenta", "migrate": "bold cyan"}
GLYPHS = {"queue": "░", "generate": "█", "paused": "▒", "migrate": "◆"}


@dataclass
class Span:
    """One bar of the timeline; `end` None while it is still open."""

    kind: str
    program_id: str
    start: float
    end: float | None = None
    request_id: str | None = None
    worker_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        subject = self.request_id or self.program_id
        return f"{self.kind:<8} {short_id(subject)}"

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start

    def describe(self, now: float) -> str:
        parts = [f"{self.kind} of program {self.program_id}"]
        if self.request_id:
            parts.append(f"request {self.request_id}")
        if self.worker_id:
            parts.append(f"worker {self.worker_id}")
        if self.kind != "migrate":
            state = "" if self.end is not None else " (still open)"
            parts.append(f"lasted {seconds(self.duration(now))}{state}")
        parts.extend(f"{k}={v}" for k, v in self.details.items() if v not in (None, ""))
        return "  ".join(parts)


def build_spans(events: list[dict[str, Any]]) -> list[Span]:
    """Spans in the order they started."""
    builder = _Builder()
    for event in events:
        builder.feed(event)
    return sorted(builder.spans, key=lambda s: s.start)


class _Builder:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._queue: dict[str, Span] = {}
        self._gen: dict[str, Span] = {}
        self._paused: dict[str, Span] = {}

    def feed(self, e: dict[str, Any]) -> None:
        kind, ts, rid = e["kind"], float(e["ts"]), e.get("request_id")
        pid = str(e.get("program_id") or "-")
        if kind == "request.queued" and rid:
            self._open(self._queue, rid, Span("queue", pid, ts, request_id=rid))
        elif kind == "request.dispatched" and rid:
            self._close(self._queue, rid, ts)
            self._open(self._gen, rid, Span("generate", pid, ts, request_id=rid,
                                            worker_id=e.get("worker_id")))
        elif kind in END_KINDS and rid:
            self._close(self._queue, rid, ts)
            self._close(self._gen, rid, ts, details=e.get("data") or {})
        elif kind == "program.status":
            self._status(pid, ts, e.get("data") or {})
        elif kind == "program.migrated":
            data = e.get("data") or {}
            self.spans.append(Span("migrate", pid, ts, ts, worker_id=data.get("target"),
                                   details={"from": data.get("source"), "by": data.get("by"),
                                            "recompute_tokens": data.get("recompute_tokens")}))

    def _status(self, pid: str, ts: float, data: dict[str, Any]) -> None:
        if data.get("old") == "PAUSED":
            self._close(self._paused, pid, ts)
        if data.get("new") == "PAUSED":
            self._open(self._paused, pid, Span("paused", pid, ts,
                                               details={"reason": data.get("reason")}))

    def _open(self, table: dict[str, Span], key: str, span: Span) -> None:
        table[key] = span
        self.spans.append(span)

    @staticmethod
    def _close(table: dict[str, Span], key: str, ts: float,
               details: dict[str, Any] | None = None) -> None:
        span = table.pop(key, None)
        if span is not None:
            span.end = ts
            span.details.update(details or {})


def bounds(spans: list[Span], now: float) -> tuple[float, float]:
    if not spans:
        return now, now
    start = min(s.start for s in spans)
    end = max(s.end if s.end is not None else now for s in spans)
    return start, max(end, start + 1e-6)


def bar_cells(span: Span, t0: float, t1: float, width: int, now: float) -> tuple[int, int]:
    """The [first, last] columns of the span in a bar `width` cells wide (at least one)."""
    scale = (width - 1) / (t1 - t0)
    first = int((span.start - t0) * scale)
    last = int(((span.end if span.end is not None else now) - t0) * scale)
    first = min(max(first, 0), width - 1)
    return first, min(max(last, first), width - 1)
