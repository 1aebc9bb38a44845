"""Lay a session's trace out as an SVG timeline: the shared spans in, shapes out.

One lane per program. console/trace_spans.py reads the events (the TUI reads them the
same way); this module only places its spans: a request draws as its queue, prefill
and decode segments; a pause from the program entering PAUSED to it leaving; a tool
call from its exec start to its end. A migration, a scheduling or control decision
and a program's end draw as markers. The template turns the shapes into SVG; every
shape carries its hover title. `zoom` widens the plot (the page scrolls it), so dense
traces stay readable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from console.trace_spans import ENDED, Segment, build_spans, slo_outcome
from console.trace_spans import Span as TraceSpan

WIDTH = 900
LABEL_W = 170
LANE_H = 40
TOP = 26
PLOT_W = WIDTH - LABEL_W - 10
ZOOMS = (1, 2, 4, 8, 16)
# (y offset in the lane, height) of each row of shapes
REQUEST_ROW, PAUSE_ROW, TOOL_ROW = (4, 14), (20, 7), (29, 7)


@dataclass(frozen=True, slots=True)
class Span:
    kind: str  # queue | prefill | decode | pause | tool
    x: float
    y: float
    w: float
    h: float
    title: str


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str  # migrate | decision | end
    x: float
    y: float
    title: str


@dataclass(slots=True)
class Lane:
    program_id: str
    y: float
    spans: list[Span] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


@dataclass(slots=True)
class Timeline:
    width: int
    height: int
    label_w: int
    duration_s: float
    lanes: list[Lane]
    ticks: list[tuple[float, str]]


def _fmt(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def layout(events: list[dict[str, Any]], now: float | None = None,
           zoom: int = 1) -> Timeline:
    """Shapes for `events` (oldest first, as GET /v1/sessions/{id}/trace returns them)."""
    zoom = zoom if zoom in ZOOMS else 1
    plot_w = PLOT_W * zoom
    width = LABEL_W + plot_w + 10
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    if not timed:
        return Timeline(width, TOP + 10, LABEL_W, 0.0, [], [])
    t0 = min(e["ts"] for e in timed)
    t_end = max([e["ts"] for e in timed] + ([now] if now is not None else []))
    duration = max(t_end - t0, 1e-3)
    placer = _Placer(t0, t_end, plot_w)
    for span in build_spans(timed):
        if span.program_id != "-":
            placer.place(span)
    for lane in placer.lanes.values():
        lane.markers.sort(key=lambda m: m.x)
    n_ticks = 4 * zoom
    ticks = [(LABEL_W + i / n_ticks * plot_w, _fmt(duration * i / n_ticks))
             for i in range(n_ticks + 1)]
    height = TOP + max(len(placer.lanes), 1) * LANE_H + 6
    return Timeline(width, height, LABEL_W, duration, list(placer.lanes.values()), ticks)


class _Placer:
    """Turns each span into shapes in its program's lane, scaled to the plot."""

    def __init__(self, t0: float, t_end: float, plot_w: float) -> None:
        self.t0, self.t_end = t0, t_end
        self.scale = plot_w / max(t_end - t0, 1e-3)
        self.lanes: dict[str, Lane] = {}

    def x(self, ts: float) -> float:
        return float(LABEL_W + (ts - self.t0) * self.scale)

    def lane(self, pid: str) -> Lane:
        if pid not in self.lanes:
            self.lanes[pid] = Lane(pid, TOP + len(self.lanes) * LANE_H)
        return self.lanes[pid]

    def end_of(self, end: float | None) -> float:
        return end if end is not None else self.t_end

    def shape(self, lane: Lane, kind: str, start: float, end: float | None,
              row: tuple[int, int], title: str) -> None:
        x0, x1 = self.x(start), self.x(self.end_of(end))
        lane.spans.append(Span(kind, x0, lane.y + row[0], max(x1 - x0, 2.0), row[1], title))

    def mark(self, lane: Lane, kind: str, ts: float, title: str) -> None:
        lane.markers.append(Marker(kind, self.x(ts), lane.y + 12, title))

    def place(self, span: TraceSpan) -> None:
        lane = self.lane(span.program_id)
        if span.kind == "request":
            self.request(lane, span)
        elif span.kind == "program":
            self.program(lane, span)
        elif span.kind == "tool" and span.segments and span.segments[0].kind == "exec":
            self.shape(lane, "tool", span.start, span.end, TOOL_ROW, _tool_title(span))
        elif span.kind == "decision":
            self.mark(lane, "decision", span.start, _decision_title(span))
        elif span.kind == "migrate":
            self.mark(lane, "migrate", span.start, _migrate_title(span))

    def program(self, lane: Lane, span: TraceSpan) -> None:
        for seg in span.segments:
            if seg.kind == "paused":
                self.shape(lane, "pause", seg.start, seg.end, PAUSE_ROW, self.pause_title(seg))
        status = span.details.get("status")
        if span.end is not None and status in ENDED:
            why = span.segments[-1].ended_why if span.segments else ""
            self.mark(lane, "end", span.end, f"{status}: {why}")

    def pause_title(self, seg: Segment) -> str:
        if seg.end is None:
            return f"paused at {_fmt(seg.start - self.t0)} ({seg.why}), still paused"
        return f"paused {_fmt(seg.end - seg.start)} ({seg.why}); {seg.ended_why}"

    def request(self, lane: Lane, span: TraceSpan) -> None:
        rid = span.request_id
        where = f"{rid} on {span.worker_id}"
        detail = _request_detail(span)
        decoded = any(seg.kind == "decode" for seg in span.segments)
        for seg in span.segments:
            took = _fmt(self.end_of(seg.end) - seg.start)
            if seg.kind == "queue":
                title = f"{rid}: queued {took}"
            elif seg.kind == "prefill":
                title = f"{where}: prefill {took}" + ("" if decoded else f"; {detail}")
            else:
                title = f"{where}: decode {took}, TTFT {_fmt(span.ttft() or 0.0)}; {detail}"
            self.shape(lane, seg.kind, seg.start, seg.end, REQUEST_ROW, title)


def _request_detail(span: TraceSpan) -> str:
    if span.end is None:
        return "running"
    d = span.details
    return (f"prompt {d.get('prompt_tokens')} (cached {d.get('cached_tokens')}), "
            f"output {d.get('output_tokens')}, {d.get('status')} ({d.get('reason')})"
            + _slo_note(span))


def _slo_note(span: TraceSpan) -> str:
    """The daemon's verdict on a finished request, from the SLO its task was tagged with."""
    slo = slo_outcome(span)
    if slo is None or slo.state == "pending":
        return ""
    missed = f" on {slo.why}" if slo.state == "missed" else ""
    targets = f"TTFT \u2264 {_fmt(slo.slo_ttft_s)}"
    if slo.slo_tpot_s is not None:
        targets += f", TPOT \u2264 {_fmt(slo.slo_tpot_s)}"
    return f"; SLO {slo.state}{missed} (task {slo.task or '?'}: {targets})"


def _tool_title(span: TraceSpan) -> str:
    d = span.details
    if span.end is None:
        return f"tool {d.get('tool')}: running"
    outcome = "ok" if d.get("ok") else str(d.get("reason"))
    return (f"tool {d.get('tool')}: {_fmt(span.end - span.start)}, exit {d.get('exit_code')}"
            f" ({outcome})")


def _decision_title(span: TraceSpan) -> str:
    d = span.details
    if span.name.startswith("control "):
        verdict = "accepted" if d.get("ok") else f"refused: {d.get('reason')}"
        return f"control decision {d.get('decision_kind')} by {d.get('by')}: {verdict}"
    where = f" on {span.worker_id}" if span.worker_id else ""
    return (f"kv.{span.name}{where} by policy {d.get('policy')} v{d.get('policy_version')}:"
            f" {d.get('reason', '')}")


def _migrate_title(span: TraceSpan) -> str:
    d = span.details
    if "call" in d:
        return f"call {d['call']} moved {d.get('from')} -> {d.get('to')}"
    return (f"migrated {d.get('from')} -> {span.worker_id} by {d.get('by') or '?'}, "
            f"recompute {d.get('recompute_tokens') or 0} tokens")
