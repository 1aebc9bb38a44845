"""A session's trace events as spans: programs, LLM requests, tool and agent calls, instants.

A `Span` is one row of a timeline, made of `Segment`s (a request: queue, prefill,
decode; a program: its statuses over time; a tool: prepare or exec) or a single
instant (a migration, a scheduling decision, a tool release). The TUI draws spans as
text bars and the web UI as SVG: both read a trace through this one module, so they
agree on what each event means. Pure functions of the API's event dicts, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

END_KINDS = ("request.finished", "request.failed", "request.aborted")
DECISIONS = ("kv.pause", "kv.mark_pause", "kv.restore", "kv.admit")
INSTANTS = ("migrate", "decision", "release")
STATUS_SEGMENT = {"QUEUED": "queued", "REASONING": "reasoning", "ACTING": "acting",
                  "PAUSED": "paused"}
ENDED = ("STOPPED", "FAILED")
TOOL_DETAILS = ("ok", "reason", "exit_code", "duration_s", "waited_s")
# what request.queued says about the SLO the daemon will judge the request by
SLO_TAGS = ("task", "slo_ttft_s", "slo_tpot_s")


@dataclass
class Segment:
    kind: str
    start: float
    end: float | None = None
    why: str = ""  # the reason the trace gave for entering it
    ended_why: str = ""  # ... and for leaving it


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

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start

    def open(self, kind: str, ts: float, why: str = "") -> None:
        self.close_segment(ts, why)
        self.segments.append(Segment(kind, ts, why=why))

    def close_segment(self, ts: float, why: str = "") -> None:
        if self.segments and self.segments[-1].end is None:
            self.segments[-1].end = ts
            self.segments[-1].ended_why = why

    def finish(self, ts: float, why: str = "") -> None:
        self.close_segment(ts, why)
        self.end = ts

    def phase(self, kind: str, now: float) -> float | None:
        """Total time in segments of `kind`; None if there was none."""
        found = [(s.end if s.end is not None else now) - s.start
                 for s in self.segments if s.kind == kind]
        return sum(found) if found else None

    def ttft(self) -> float | None:
        """A request's time to first token from its first queueing, as the daemon counts it."""
        d = self.details
        return d["first_token_at"] - d["queued_at"] if "first_token_at" in d else None

    def tpot(self) -> float | None:
        """A finished request's time per output token after the first (0 for one token)."""
        out, first = self.details.get("output_tokens"), self.details.get("first_token_at")
        if self.end is None or first is None or not isinstance(out, int) or out < 1:
            return None
        return (self.end - first) / (out - 1) if out > 1 else 0.0


@dataclass(frozen=True)
class SloOutcome:
    """A request against its SLO: `state` met | missed | pending; `why` what missed."""

    state: str
    why: str
    ttft_s: float | None
    tpot_s: float | None
    slo_ttft_s: float
    slo_tpot_s: float | None  # None: only a TTFT SLO is known (the operator's fallback)
    task: str | None


def slo_outcome(span: Span, fallback_ttft_s: float | None = None) -> SloOutcome | None:
    """Judge a request span the way the daemon does: against the SLO its task was tagged
    with (TTFT and TPOT), else against `fallback_ttft_s` (TTFT only); None when neither."""
    d = span.details
    per_task = isinstance(d.get("slo_ttft_s"), int | float)
    slo_ttft = float(d["slo_ttft_s"]) if per_task else fallback_ttft_s
    if slo_ttft is None:
        return None
    slo_tpot = d.get("slo_tpot_s") if per_task and isinstance(
        d.get("slo_tpot_s"), int | float) else None
    ttft, tpot = span.ttft(), span.tpot()
    state, why = _judge(span, ttft, tpot, slo_ttft, slo_tpot)
    return SloOutcome(state, why, ttft, tpot, slo_ttft, slo_tpot,
                      str(d["task"]) if per_task and d.get("task") else None)


def _judge(span: Span, ttft: float | None, tpot: float | None, slo_ttft: float,
           slo_tpot: float | None) -> tuple[str, str]:
    if ttft is None:
        return ("missed", "no first token") if span.end is not None else ("pending", "")
    if ttft > slo_ttft:
        return "missed", "ttft"
    if slo_tpot is None:
        return "met", ""
    if tpot is None:
        return "pending", "tpot"
    return ("met", "") if tpot <= slo_tpot else ("missed", "tpot")


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
        self._open: dict[tuple[str, str], Span] = {}  # tool and agent calls in progress

    def feed(self, e: dict[str, Any]) -> None:
        kind, ts = e["kind"], float(e["ts"])
        pid = str(e.get("program_id") or "-")
        data = e.get("data") or {}
        if pid != "-" and pid not in self.programs_seen:
            self.programs_seen.append(pid)
        if kind.startswith("request."):
            self._request(kind, e, ts, pid, data)
        elif kind.startswith("program."):
            self._program(kind, ts, pid, data)
        elif kind.startswith("tool."):
            self._tool(kind, ts, pid, data)
        elif kind.startswith("future."):
            self._future(kind, ts, pid, data)
        elif kind in DECISIONS:
            self._add(Span("decision", pid, ts, ts, worker_id=e.get("worker_id"),
                           name=kind.removeprefix("kv."), details=dict(data)))
        elif kind == "control.decision":
            self._add(Span("decision", pid, ts, ts, name=f"control {data.get('decision_kind')}",
                           details=dict(data)))

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
            span.details.update({k: data[k] for k in SLO_TAGS if data.get(k) is not None})
            span.open("queue", ts)
        elif kind == "request.dispatched":
            span.worker_id = e.get("worker_id")
            span.open("prefill", ts)
        elif kind == "request.first_token":
            span.details["first_token_at"] = ts
            span.open("decode", ts)
        elif kind in ("request.requeued", "request.failover"):
            span.details["moves"] = int(span.details.get("moves", 0)) + 1
            span.open("queue", ts, str(data.get("reason") or ""))
        elif kind in END_KINDS:
            span.details["status"] = kind.removeprefix("request.")
            span.details.update((k, v) for k, v in data.items() if k != "status")
            span.finish(ts, str(data.get("reason") or ""))

    def _program(self, kind: str, ts: float, pid: str, data: dict[str, Any]) -> None:
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
            new, why = str(data.get("new")), str(data.get("reason") or "")
            span.details["status"] = new
            if why:
                span.details["reason"] = why
            if new in STATUS_SEGMENT:
                span.open(STATUS_SEGMENT[new], ts, why)
            else:
                span.finish(ts, why)

    def _tool(self, kind: str, ts: float, pid: str, data: dict[str, Any]) -> None:
        tool = str(data.get("tool") or "?")
        if kind == "tool.release":
            self._add(Span("release", pid, ts, ts, name=tool, details=dict(data)))
            return
        phase = "exec" if kind.startswith("tool.exec") else "prepare"
        key = (pid, f"{phase}:{tool}:{data.get('exec_id', '')}")
        if kind.endswith(".start"):
            span = self._open[key] = self._add(Span("tool", pid, ts, name=f"{tool} {phase}",
                                                    details={"tool": tool}))
            span.open(phase, ts)
            return
        opened = self._open.pop(key, None)
        if opened is None:  # its start is before the events read, or was never traced
            opened = self._add(Span("tool", pid, ts, name=f"{tool} {phase}",
                                    details={"tool": tool}))
            opened.open(phase, ts)
        opened.details.update({k: data[k] for k in TOOL_DETAILS if k in data})
        opened.finish(ts)

    def _future(self, kind: str, ts: float, pid: str, data: dict[str, Any]) -> None:
        key = (pid, f"future:{data.get('run_id')}:{data.get('id')}")
        if kind == "future.created":
            span = self._open[key] = self._add(Span(
                "call", pid, ts, name=f"{data.get('kind', '?')} {data.get('name', '')}"))
            span.open("call", ts)
        elif kind == "future.resolved" and key in self._open:
            call = self._open.pop(key)
            call.details.update(status=data.get("status"), error=data.get("error"))
            call.finish(ts)
        elif kind == "future.migrated":
            self._add(Span("migrate", pid, ts, ts, name=f"call → {data.get('destination')}",
                           details={"from": data.get("source"), "to": data.get("destination"),
                                    "call": data.get("id")}))


def bounds(spans: list[Span], now: float) -> tuple[float, float]:
    if not spans:
        return now, now
    start = min(s.start for s in spans)
    end = max(s.end if s.end is not None else now for s in spans)
    return start, max(end, start + 1e-6)
