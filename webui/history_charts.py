"""The overview's charts and alerts from the daemon's stored history (GET /v1/history,
GET /v1/events), so an operator arriving after an incident sees it at once. Pure: the
caller fetches; this lays out SVG polylines and words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHART_W, CHART_H = 300, 80
RANGES = {"15m": 900.0, "hour": 3600.0, "day": 86400.0}  # the overview's range selector
DEFAULT_RANGE = "hour"
POINTS = 300  # about this many points across a chart
FAILURE_WINDOW_S = 300.0  # failed / refused requests and 5xx answers raise an alert...
CRASH_WINDOW_S = 600.0  # ... and so does a worker crash, for longer
FAILURE_KINDS = ("request.failed", "request.refused", "http.5xx")
CRASH_KINDS = ("worker.exited", "worker.crash", "worker.gone")


@dataclass(frozen=True, slots=True)
class ChartSpec:
    key: str
    title: str
    unit: str
    series: tuple[str, ...]  # one line each (a series with labels: one line per label)
    y_max: float | None = None


CHARTS = (
    ChartSpec("throughput", "Throughput", "tokens/s", ("tokens_per_s",)),
    ChartSpec("requests", "Requests and goodput (within their SLOs)", "req/s",
              ("requests_per_s", "goodput_per_s")),
    ChartSpec("errors", "Errors: failed, refused, 5xx", "/s",
              ("failed_per_s", "refused_per_s", "http_5xx_per_s")),
    ChartSpec("ttft", "Time to first token p50 / p95 / p99", "s",
              ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s")),
    ChartSpec("tpot", "Time per output token p50 / p95 / p99", "s",
              ("tpot_p50_s", "tpot_p95_s", "tpot_p99_s")),
    ChartSpec("kv", "KV cache used, per worker", "%", ("kv_used_pct",), y_max=100.0),
    ChartSpec("queue", "Queue length, paused programs, pauses per second", "",
              ("queue_length", "paused_programs", "pauses_per_s")),
)
SERIES = sorted({s for c in CHARTS for s in c.series})


def range_of(value: Any) -> str:
    return value if value in RANGES else DEFAULT_RANGE


def step_of(span: float) -> int:
    return max(int(span / POINTS), 1)


def charts_of(body: dict[str, Any], now: float, span: float) -> list[dict[str, Any]]:
    """One chart per CHARTS entry from a /v1/history answer over the last `span` s."""
    lines: dict[str, list[dict[str, Any]]] = {}
    for s in body.get("series", []):
        lines.setdefault(s["name"], []).append(s)
    return [_chart(spec, [ln for name in spec.series for ln in lines.get(name, [])], now, span)
            for spec in CHARTS]


def _chart(spec: ChartSpec, lines: list[dict[str, Any]], now: float,
           span: float) -> dict[str, Any]:
    shown = [[(t, v) for t, v in ln["points"] if now - t <= span] for ln in lines]
    values = [v for pts in shown for _, v in pts]
    top = spec.y_max if spec.y_max is not None else max([*values, 0.0]) * 1.1 or 1.0
    out = []
    for n, (ln, pts) in enumerate(zip(lines, shown, strict=True)):
        coords = [(CHART_W * (1 - (now - t) / span), CHART_H * (1 - min(v, top) / top))
                  for t, v in pts]
        if len(coords) == 1:  # a lone point is a line of no length: draw it as a short dash
            coords.insert(0, (coords[0][0] - 2.0, coords[0][1]))
        name = ln["name"] + (f" {ln['label']}" if ln.get("label") else "")
        out.append({"name": name, "n": len(pts), "cls": f"line-{n % 4}",
                    "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in coords),
                    "last": f"{pts[-1][1]:.3g}" if pts else "none"})
    unit = f" {spec.unit}" if spec.unit else ""
    last = ", ".join(f"{ln['name']} {ln['last']}" for ln in out) + unit if any(
        ln["n"] for ln in out) else "no data in this range"
    return {"key": spec.key, "title": spec.title, "unit": spec.unit, "lines": out,
            "since": f"\u2212{span / 3600:.0f} h" if span >= 3600 else f"\u2212{span / 60:.0f} min",
            "top": f"{top:.3g}{unit}", "last": last, "n": sum(ln["n"] for ln in out)}


def event_row(e: dict[str, Any]) -> dict[str, Any]:
    return {"id": e["id"], "ts": e["ts"], "last_ts": e["last_ts"], "kind": e["kind"],
            "severity": e["severity"], "count": e["count"], "message": e["message"],
            "worker_id": e.get("worker_id"), "tenant": e.get("tenant")}


def recent_alerts(events: list[dict[str, Any]], now: float) -> list[str]:
    """Alerts from what failed lately: requests failed, refused or answered 5xx in the
    last FAILURE_WINDOW_S; a worker crash in the last CRASH_WINDOW_S."""
    out = []
    failed: dict[str, int] = {}
    for e in events:
        if e["kind"] in FAILURE_KINDS and now - e["last_ts"] <= FAILURE_WINDOW_S:
            failed[e["kind"]] = failed.get(e["kind"], 0) + int(e["count"])
    words = {"request.failed": "request(s) failed", "request.refused": "request(s) refused",
             "http.5xx": "API answer(s) with a 5xx status"}
    out += [f"{n} {words[k]} in the last {FAILURE_WINDOW_S / 60:.0f} minutes"
            for k, n in sorted(failed.items())]
    for e in events:
        if e["kind"] in CRASH_KINDS and now - e["ts"] <= CRASH_WINDOW_S:
            out.append(f"{e['message']} ({(now - e['ts']) / 60:.0f} min ago)")
    return out
