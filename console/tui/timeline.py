"""A session's trace events as timeline rows: programs, LLM requests, tool calls, events.

A row is a `Span` made of `Segment`s (a request: queue, prefill, decode; a program:
its statuses over time) or a single instant (a migration, a scheduling decision).
Pure functions of the API's event dicts, so the trace view and its tests share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from console.render import seconds, short_id

END_KINDS = ("request.finished", "request.failed", "request.aborted")
DECISIONS = ("kv.pause", "kv.mark_pause", "kv.restore", "kv.admit")
INSTANTS = ("migrate", "decision", "release")
STATUS_SEGMENT = {"QUEUED": "queued", "REASONING": "reasoning", "ACTING": "acting",
                  "PAUSED": "paused"}
STYLES = {
    "queue": "yellow", "prefill": "cyan", "decode": "green",
    "queued": "yellow", "reasoning": "blue", "acting": "dark_orange", "paused": "magenta",
    "prepare": "grey62", "exec": "dark_orange", "call": "bright_blue",
    "migrate": "bold cyan", "decision": "bold white", "release": "red",
}
GLYPHS = {
    "queue": "░", "prefill": "▓", "decode": "█",
    "queued": "░", "reasoning": "━", "acting": "─", "paused": "▒",
    "prepare": "▒", "exec": "█", "call": "▬",
    "migrate": "◆", "decision": "●", "release": "✕",
}
TOOL_DETAILS = ("ok", "reason", "exit_code", "duration_s", "waited_s")
LEGEND = ("queue", "prefill", "decode", "reasoning", "acting", "paused", "exec", "call",
          "migrate", "decision")


@dataclass
class Segment:
    kind: str
    start: float
    end: float | None = None


@dataclass
class Span:
    """One timeline row; `end` None while it is still open."""

    kind: str  # program | request | tool | call | migrate | decision | release
    program_id: str
    start: float
    end: float | None = None
    request_id: str | None = None
    worker_id: str | None = None
    name: str = ""
    segments: list[Segment] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def instant(self) -> bool:
        return self.kind in INSTANTS

    @property
    def label(self) -> str:
        if self.kind == "program":
            return f"program  {short_id(self.program_id)}"
        if self.kind == "request":
            return f"  llm    {short_id(self.request_id)}"
        return f"  {self.kind:<6} {self.name}"

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start

    def open(self, kind: str, ts: float) -> None:
        self.close_segment(ts)
        self.segments.append(Segment(kind, ts))

    def close_segment(self, ts: float) -> None:
        if self.segments and self.segments[-1].end is None:
            self.segments[-1].end = ts

    def finish(self, ts: float, **details: Any) -> None:
        self.close_segment(ts)
        self.end = ts
        self.details.update(details)

    def phase(self, kind: str, now: float) -> float | None:
        """Total time in segments of `kind`; None if there was none."""
        found = [(s.end if s.end is not None else now) - s.start
                 for s in self.segments if s.kind == kind]
        return sum(found) if found else None


def build_spans(events: list[dict[str, Any]]) -> list[Span]:
    """Rows grouped by program (in order of appearance), each group in start order."""
    builder = _Builder()
    for event in events:
        builder.feed(event)
    order = {pid: i for i, pid in enumerate(builder.programs_seen)}
    return sorted(builder.spans, key=lambda s: (order.get(s.program_id, len(order)),
                                                s.kind != "program", s.start))


class _Builder:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.programs_seen: list[str] = []
        self._programs: dict[str, Span] = {}
        self._requests: dict[str, Span] = {}
        self._tools: dict[tuple[str, str], Span] = {}

    def feed(self, e: dict[str, Any]) -> None:
        kind, ts = e["kind"], float(e["ts"])
        pid = str(e.get("program_id") or "-")
        data = e.get("data") or {}
        if pid != "-" and pid not in self.programs_seen:
            self.programs_seen.append(pid)
        if kind.startswith("request."):
            self._request(kind, e, ts, pid, data)
        elif kind.startswith("program."):
            self._program(kind, ts, pid, data, e.get("worker_id"))
        elif kind.startswith("tool."):
            self._tool(kind, ts, pid, data)
        elif kind.startswith("future."):
            self._future(kind, ts, pid, data)
        elif kind in DECISIONS:
            self._add(Span("decision", pid, ts, ts, worker_id=e.get("worker_id"),
                           name=kind.removeprefix("kv."), details=dict(data)))

    def _add(self, span: Span) -> Span:
        self.spans.append(span)
        return span

    def _request(self, kind: str, e: dict[str, Any], ts: float, pid: str,
                 data: dict[str, Any]) -> None:
        rid = e.get("request_id")
        if not rid:
            return
        span = self._requests.get(rid)
        if span is None:
            span = self._requests[rid] = self._add(Span("request", pid, ts, request_id=rid))
            span.details["queued_at"] = ts
        if kind == "request.queued":
            span.open("queue", ts)
        elif kind == "request.dispatched":
            span.worker_id = e.get("worker_id")
            span.open("prefill", ts)
        elif kind == "request.first_token":
            span.details["first_token_at"] = ts
            span.open("decode", ts)
        elif kind in ("request.requeued", "request.failover"):
            span.details["moves"] = int(span.details.get("moves", 0)) + 1
            span.open("queue", ts)
        elif kind in END_KINDS:
            span.finish(ts, status=kind.removeprefix("request."), **data)

    def _program(self, kind: str, ts: float, pid: str, data: dict[str, Any],
                 worker: str | None) -> None:
        span = self._programs.get(pid)
        if span is None:
            span = self._programs[pid] = self._add(Span("program", pid, ts))
            span.open("queued", ts)
        if kind == "program.migrated":
            self._add(Span("migrate", pid, ts, ts, worker_id=data.get("target"),
                           name=f"→ {data.get('target')}",
                           details={"from": data.get("source"), "by": data.get("by"),
                                    "recompute_tokens": data.get("recompute_tokens")}))
        elif kind == "program.status":
            new = str(data.get("new"))
            span.details["status"] = new
            if data.get("reason"):
                span.details["reason"] = data["reason"]
            if new in STATUS_SEGMENT:
                span.open(STATUS_SEGMENT[new], ts)
            else:
                span.finish(ts)

    def _tool(self, kind: str, ts: float, pid: str, data: dict[str, Any]) -> None:
        tool = str(data.get("tool") or "?")
        if kind == "tool.release":
            self._add(Span("release", pid, ts, ts, name=tool, details=dict(data)))
            return
        phase = "exec" if kind.startswith("tool.exec") else "prepare"
        key = (pid, f"{phase}:{tool}:{data.get('exec_id', '')}")
        if kind.endswith(".start"):
            span = self._tools[key] = self._add(Span("tool", pid, ts, name=f"{tool} {phase}"))
            span.open(phase, ts)
            return
        opened = self._tools.pop(key, None)
        span = opened if opened is not None else self._add(Span("tool", pid, ts,
                                                                name=f"{tool} {phase}"))
        span.finish(ts, **{k: data[k] for k in TOOL_DETAILS if k in data})

    def _future(self, kind: str, ts: float, pid: str, data: dict[str, Any]) -> None:
        key = (pid, f"future:{data.get('run_id')}:{data.get('id')}")
        if kind == "future.created":
            span = self._tools[key] = self._add(Span(
                "call", pid, ts, name=f"{data.get('kind', '?')} {data.get('name', '')}"))
            span.open("call", ts)
        elif kind == "future.resolved" and key in self._tools:
            self._tools.pop(key).finish(ts, status=data.get("status"), error=data.get("error"))


def describe(span: Span, now: float, ttft_slo_s: float | None = None) -> str:
    """The drill-down text of one row."""
    head = {"program": f"program {span.program_id}",
            "request": f"request {span.request_id} of program {span.program_id}",
            "migrate": f"migrate of program {span.program_id}"}.get(
        span.kind, f"{span.kind} {span.name} of program {span.program_id}")
    parts = [head]
    if span.worker_id:
        parts.append(f"worker {span.worker_id}")
    if not span.instant:
        parts.append(f"lasted {seconds(span.duration(now))}"
                     + ("" if span.end is not None else " (still open)"))
    if span.kind == "request":
        parts += _request_parts(span, now, ttft_slo_s)
    elif span.kind == "program":
        parts += [f"{kind} {seconds(t)}" for kind in ("queued", "reasoning", "acting", "paused")
                  if (t := span.phase(kind, now))]
    shown = {"queued_at", "first_token_at", "prompt_tokens", "cached_tokens", "output_tokens"}
    parts += [f"{k}={_value(v)}" for k, v in span.details.items()
              if k not in shown and v is not None and v is not False and v != ""]
    return "  ".join(parts)


def _value(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _request_parts(span: Span, now: float, ttft_slo_s: float | None) -> list[str]:
    d = span.details
    parts = [f"{kind} {seconds(t)}" for kind in ("queue", "prefill", "decode")
             if (t := span.phase(kind, now)) is not None]
    if "prompt_tokens" in d:
        parts.append(f"tokens: prompt {d['prompt_tokens']} (cached {d.get('cached_tokens', 0)})"
                     f" output {d.get('output_tokens', 0)}")
    ttft = (d["first_token_at"] - d["queued_at"]) if "first_token_at" in d else None
    parts.append(f"ttft {seconds(ttft)}")
    if ttft_slo_s is not None:
        parts.append(slo_verdict(ttft, ttft_slo_s, span.end is not None))
    return parts


def slo_verdict(ttft: float | None, slo_s: float, ended: bool) -> str:
    if ttft is None:
        return "SLO missed (no first token)" if ended else "SLO pending"
    met = "met" if ttft <= slo_s else "MISSED"
    return f"SLO {met} (ttft ≤ {seconds(slo_s)})"


def bounds(spans: list[Span], now: float) -> tuple[float, float]:
    if not spans:
        return now, now
    start = min(s.start for s in spans)
    end = max(s.end if s.end is not None else now for s in spans)
    return start, max(end, start + 1e-6)


def cells(start: float, end: float, t0: float, t1: float, width: int) -> tuple[int, int]:
    """The [first, last] columns of [start, end] in a bar `width` cells wide (at least one)."""
    scale = (width - 1) / (t1 - t0)
    first = min(max(int((start - t0) * scale), 0), width - 1)
    last = min(max(int((end - t0) * scale), first), width - 1)
    return first, last


def bar_cells(span: Span, t0: float, t1: float, width: int, now: float) -> tuple[int, int]:
    return cells(span.start, span.end if span.end is not None else now, t0, t1, width)
