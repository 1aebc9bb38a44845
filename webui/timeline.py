"""Lay a session's trace events out as an SVG timeline: pure data in, shapes out.

One lane per program. A request draws as a queue span (queued -> dispatched) and a
generation span (dispatched -> finished); a pause draws as a span from the program
entering PAUSED to it leaving; a migration and a program's end draw as markers. The
template turns the shapes into SVG; every shape carries the text for its hover title.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WIDTH = 900
LABEL_W = 170
LANE_H = 34
TOP = 26
PLOT_W = WIDTH - LABEL_W - 10


@dataclass(frozen=True, slots=True)
class Span:
    kind: str  # queue | generate | pause
    x: float
    y: float
    w: float
    h: float
    title: str


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str  # migrate | first_token | end
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


def layout(events: list[dict[str, Any]], now: float | None = None) -> Timeline:
    """Shapes for `events` (oldest first, as GET /v1/sessions/{id}/trace returns them)."""
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    if not timed:
        return Timeline(WIDTH, TOP + 10, LABEL_W, 0.0, [], [])
    t0 = min(e["ts"] for e in timed)
    t_end = max(e["ts"] for e in timed)
    if now is not None:
        t_end = max(t_end, now)
    duration = max(t_end - t0, 1e-3)

    def x_of(ts: float) -> float:
        return float(LABEL_W + (ts - t0) / duration * PLOT_W)

    order: list[str] = []
    for e in timed:
        pid = e.get("program_id")
        if isinstance(pid, str) and pid not in order:
            order.append(pid)
    lanes = {pid: Lane(pid, TOP + i * LANE_H) for i, pid in enumerate(order)}
    requests: dict[str, dict[str, Any]] = {}
    paused_at: dict[str, tuple[float, str]] = {}

    for e in timed:
        pid = e.get("program_id")
        if not isinstance(pid, str) or pid not in lanes:
            continue
        lane = lanes[pid]
        kind, ts, data = e["kind"], float(e["ts"]), e.get("data") or {}
        rid = e.get("request_id")
        if kind == "request.queued" and rid:
            requests[rid] = {"pid": pid, "queued": ts, "max_tokens": data.get("max_tokens")}
        elif kind == "request.dispatched" and rid:
            requests.setdefault(rid, {"pid": pid, "queued": ts})
            requests[rid].update(dispatched=ts, worker=e.get("worker_id"))
        elif kind == "request.first_token" and rid:
            requests.setdefault(rid, {"pid": pid})["first_token"] = ts
        elif kind == "request.finished" and rid:
            requests.setdefault(rid, {"pid": pid})["finished"] = (ts, data)
        elif kind == "program.status":
            if data.get("new") == "PAUSED":
                paused_at[pid] = (ts, str(data.get("reason", "")))
            elif data.get("old") == "PAUSED" and pid in paused_at:
                start, why = paused_at.pop(pid)
                lane.spans.append(_span(
                    "pause", x_of(start), x_of(ts), lane.y + 20, 8,
                    f"paused {_fmt(ts - start)} ({why}); {data.get('reason', '')}"))
            if data.get("new") in ("STOPPED", "FAILED"):
                lane.markers.append(Marker("end", x_of(ts), lane.y + 12,
                                           f"{data.get('new')}: {data.get('reason', '')}"))
        elif kind == "program.migrated":
            lane.markers.append(Marker(
                "migrate", x_of(ts), lane.y + 12,
                f"migrated {data.get('source')} -> {data.get('target')}"
                f" by {data.get('by', '?')}, recompute {data.get('recompute_tokens', 0)} tokens"))
    for pid, (start, why) in paused_at.items():
        lane = lanes[pid]
        lane.spans.append(_span("pause", x_of(start), x_of(t_end), lane.y + 20, 8,
                                f"paused at {_fmt(start - t0)} ({why}), still paused"))

    for rid, r in requests.items():
        lane = lanes[r["pid"]]
        queued = r.get("queued")
        dispatched = r.get("dispatched")
        fin = r.get("finished")
        end_ts = fin[0] if fin else t_end
        if queued is not None:
            q_end = dispatched if dispatched is not None else end_ts
            lane.spans.append(_span("queue", x_of(queued), x_of(q_end), lane.y + 4, 14,
                                    f"{rid}: queued {_fmt(q_end - queued)}"))
        if dispatched is not None:
            detail = ""
            if fin:
                d = fin[1]
                detail = (f", prompt {d.get('prompt_tokens')} (cached {d.get('cached_tokens')})"
                          f", output {d.get('output_tokens')}, {d.get('reason')}")
            else:
                detail = ", running"
            ttft = r.get("first_token")
            ttft_text = f", TTFT {_fmt(ttft - dispatched)}" if ttft is not None else ""
            lane.spans.append(_span(
                "generate", x_of(dispatched), x_of(end_ts), lane.y + 4, 14,
                f"{rid} on {r.get('worker')}: generating {_fmt(end_ts - dispatched)}"
                f"{ttft_text}{detail}"))

    ticks = [(LABEL_W + i / 4 * PLOT_W, _fmt(duration * i / 4)) for i in range(5)]
    height = TOP + max(len(order), 1) * LANE_H + 6
    return Timeline(WIDTH, height, LABEL_W, duration, list(lanes.values()), ticks)


def _span(kind: str, x0: float, x1: float, y: float, h: float, title: str) -> Span:
    return Span(kind, x0, y, max(x1 - x0, 2.0), h, title)
