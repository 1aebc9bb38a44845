"""Lay a session's trace events out as an SVG timeline: pure data in, shapes out.

One lane per program. A request draws as a queue span (queued -> dispatched), a prefill
span (dispatched -> first token) and a decode span (first token -> finished); a pause
draws from the program entering PAUSED to it leaving; a tool call from its exec start to
its end. A migration, a scheduling policy's decision and a program's end draw as
markers. The template turns the shapes into SVG; every shape carries its hover title.
`zoom` widens the plot (the page scrolls it), so dense traces stay readable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WIDTH = 900
LABEL_W = 170
LANE_H = 40
TOP = 26
PLOT_W = WIDTH - LABEL_W - 10
ZOOMS = (1, 2, 4, 8, 16)
REQUEST_ENDS = ("request.finished", "request.aborted", "request.failed")
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
    builder = _Builder(t0, t_end, plot_w)
    for e in timed:
        builder.take(e)
    builder.close_open_spans()
    n_ticks = 4 * zoom
    ticks = [(LABEL_W + i / n_ticks * plot_w, _fmt(duration * i / n_ticks))
             for i in range(n_ticks + 1)]
    height = TOP + max(len(builder.lanes), 1) * LANE_H + 6
    return Timeline(width, height, LABEL_W, duration, list(builder.lanes.values()), ticks)


class _Builder:
    """Reads events in order, keeping what is open (requests, pauses, tool calls)."""

    def __init__(self, t0: float, t_end: float, plot_w: float) -> None:
        self.t0, self.t_end = t0, t_end
        self.scale = plot_w / max(t_end - t0, 1e-3)
        self.lanes: dict[str, Lane] = {}
        self.requests: dict[str, dict[str, Any]] = {}
        self.paused_at: dict[str, tuple[float, str]] = {}
        self.tools: dict[tuple[str, Any], tuple[float, Any]] = {}

    def x(self, ts: float) -> float:
        return float(LABEL_W + (ts - self.t0) * self.scale)

    def lane(self, pid: str) -> Lane:
        if pid not in self.lanes:
            self.lanes[pid] = Lane(pid, TOP + len(self.lanes) * LANE_H)
        return self.lanes[pid]

    def span(self, lane: Lane, kind: str, start: float, end: float, row: tuple[int, int],
             title: str) -> None:
        x0, x1 = self.x(start), self.x(end)
        lane.spans.append(Span(kind, x0, lane.y + row[0], max(x1 - x0, 2.0), row[1], title))

    def mark(self, lane: Lane, kind: str, ts: float, title: str) -> None:
        lane.markers.append(Marker(kind, self.x(ts), lane.y + 12, title))

    def take(self, e: dict[str, Any]) -> None:
        pid = e.get("program_id")
        if not isinstance(pid, str):
            return
        lane = self.lane(pid)
        kind, ts, data = str(e["kind"]), float(e["ts"]), e.get("data") or {}
        rid = e.get("request_id")
        if kind.startswith("request.") and rid:
            self.request_event(pid, rid, kind, ts, e, data)
        elif kind == "tool.exec.start":
            self.tools[(pid, data.get("exec_id"))] = (ts, data.get("tool"))
        elif kind == "tool.exec.end":
            start, _ = self.tools.pop((pid, data.get("exec_id")), (ts, None))
            self.span(lane, "tool", start, ts, TOOL_ROW, _tool_title(data, ts - start))
        elif kind.startswith("kv."):
            self.mark(lane, "decision", ts, _decision_title(e))
        elif kind == "program.status":
            self.status_event(lane, ts, data)
        elif kind == "program.migrated":
            self.mark(lane, "migrate", ts,
                      f"migrated {data.get('source')} -> {data.get('target')} by "
                      f"{data.get('by', '?')}, recompute {data.get('recompute_tokens', 0)} tokens")

    def request_event(self, pid: str, rid: str, kind: str, ts: float, e: dict[str, Any],
                      data: dict[str, Any]) -> None:
        r = self.requests.setdefault(rid, {"pid": pid})
        if kind == "request.queued":
            r["queued"] = ts
        elif kind == "request.dispatched":
            r.setdefault("queued", ts)
            r.update(dispatched=ts, worker=e.get("worker_id"))
        elif kind == "request.first_token":
            r["first_token"] = ts
        elif kind in REQUEST_ENDS:
            r["finished"] = (ts, {**data, "kind": kind})

    def status_event(self, lane: Lane, ts: float, data: dict[str, Any]) -> None:
        pid = lane.program_id
        if data.get("new") == "PAUSED":
            self.paused_at[pid] = (ts, str(data.get("reason", "")))
        elif data.get("old") == "PAUSED" and pid in self.paused_at:
            start, why = self.paused_at.pop(pid)
            self.span(lane, "pause", start, ts, PAUSE_ROW,
                      f"paused {_fmt(ts - start)} ({why}); {data.get('reason', '')}")
        if data.get("new") in ("STOPPED", "FAILED"):
            self.mark(lane, "end", ts, f"{data.get('new')}: {data.get('reason', '')}")

    def close_open_spans(self) -> None:
        """Draw what is still open up to the end of the trace, then every request."""
        for pid, (start, why) in self.paused_at.items():
            self.span(self.lanes[pid], "pause", start, self.t_end, PAUSE_ROW,
                      f"paused at {_fmt(start - self.t0)} ({why}), still paused")
        for (pid, _), (start, tool) in self.tools.items():
            self.span(self.lanes[pid], "tool", start, self.t_end, TOOL_ROW,
                      f"tool {tool}: running")
        for rid, r in self.requests.items():
            self.request_spans(self.lanes[r["pid"]], rid, r)

    def request_spans(self, lane: Lane, rid: str, r: dict[str, Any]) -> None:
        fin = r.get("finished")
        end_ts = fin[0] if fin else self.t_end
        queued, dispatched, first = r.get("queued"), r.get("dispatched"), r.get("first_token")
        if queued is not None:
            q_end = dispatched if dispatched is not None else end_ts
            self.span(lane, "queue", queued, q_end, REQUEST_ROW,
                      f"{rid}: queued {_fmt(q_end - queued)}")
        if dispatched is None:
            return
        where = f"{rid} on {r.get('worker')}"
        detail = "running"
        if fin:
            d = fin[1]
            detail = (f"prompt {d.get('prompt_tokens')} (cached {d.get('cached_tokens')}), "
                      f"output {d.get('output_tokens')}, {d['kind'].split('.')[-1]} "
                      f"({d.get('reason')})")
        prefill_end = first if first is not None else end_ts
        self.span(lane, "prefill", dispatched, prefill_end, REQUEST_ROW,
                  f"{where}: prefill {_fmt(prefill_end - dispatched)}"
                  + ("" if first is not None else f"; {detail}"))
        if first is not None:
            self.span(lane, "decode", first, end_ts, REQUEST_ROW,
                      f"{where}: decode {_fmt(end_ts - first)}, TTFT "
                      f"{_fmt(first - dispatched)}; {detail}")


def _tool_title(data: dict[str, Any], took: float) -> str:
    outcome = "ok" if data.get("ok") else str(data.get("reason"))
    return f"tool {data.get('tool')}: {_fmt(took)}, exit {data.get('exit_code')} ({outcome})"


def _decision_title(e: dict[str, Any]) -> str:
    data = e.get("data") or {}
    where = f" on {e.get('worker_id')}" if e.get("worker_id") else ""
    return (f"{e['kind']}{where} by policy {data.get('policy')} v{data.get('policy_version')}:"
            f" {data.get('reason', '')}")
