"""The overview's facts: workers, alerts, active policies, newest programs, charts of the
daemon's stored history, recent events.

One `snapshot` serves both the first render and every live update (/ui/events), so
the page and its SSE stream can never disagree on what a field means.
"""

from __future__ import annotations

import time
from typing import Any

from webui import history_charts as hc
from webui.client import Api, ApiError

EVENTS_SHOWN = 20
CHARTS_FRESH_S = 5.0  # viewers share one read of the history per range for this long


def engine_label(engine: Any) -> str:
    return "sim (simulated)" if engine == "sim" else str(engine)


def worker_row(w: dict[str, Any]) -> dict[str, Any]:
    stats = w.get("stats") or {}
    cap = stats.get("kv_capacity_tokens") or w.get("kv_capacity_tokens") or 0
    used = stats.get("kv_used_tokens") or 0
    return {
        "id": w.get("id"), "engine": engine_label(w.get("engine")), "model": w.get("model"),
        "status": w.get("status"), "healthy": w.get("status") == "healthy",
        "kv_used": used, "kv_capacity": cap,
        "kv_pct": round(100.0 * used / cap, 1) if cap else 0.0,
        "running": stats.get("running", 0), "waiting": stats.get("waiting", 0),
        "inflight": w.get("inflight", 0), "host": w.get("host"),
        "node": w.get("node") or w.get("host") or "", "dp_rank": w.get("dp_rank"),
        "last_seen_s_ago": w.get("last_seen_s_ago"),
    }


def alerts_of(workers: list[dict[str, Any]], health: dict[str, Any]) -> list[str]:
    out = [f"worker {w['id']} is {w['status']}" for w in workers if not w["healthy"]]
    if not any(w["healthy"] for w in workers):
        out.append("no healthy worker: requests will wait in the queue")
    if health.get("status") not in (None, "ok"):
        out.append(f"daemon is {health.get('status')}: {health.get('store_error') or ''}")
    return out


def program_row(p: dict[str, Any]) -> dict[str, Any]:
    return {"id": p["id"], "session_id": p["session_id"], "status": p["status"],
            "worker_id": p.get("worker_id"), "steps": p.get("steps", 0),
            "context_tokens": p.get("context_tokens", 0), "held": bool(p.get("held")),
            "pinned": bool(p.get("pinned")), "created_at": p.get("created_at")}


async def active_policies(api: Api) -> list[dict[str, Any]]:
    try:
        rows = await api.policies()
    except ApiError as exc:
        if exc.status == 503:  # the registry starts a moment after the API answers
            return []
        raise
    return [{"name": p["name"], "layer": p["layer"], "version": p["active_version"]}
            for p in rows if p.get("active")]


class ChartCache:
    """The newest /v1/history answer per range. The series are cluster-wide aggregates
    every reader of the daemon sees alike (daemon/api/history_api.py), so viewers share
    them; events are per tenant and are read per viewer."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[float, dict[str, Any]]] = {}

    async def history(self, api: Api, range_name: str, now: float) -> dict[str, Any]:
        held = self._held.get(range_name)
        if held is not None and now - held[0] < CHARTS_FRESH_S:
            return held[1]
        span = hc.RANGES[range_name]
        body = await api.history(hc.SERIES, -span, hc.step_of(span))
        self._held[range_name] = (now, body)
        return body


async def snapshot(api: Api, charts: ChartCache, range_name: str = hc.DEFAULT_RANGE
                   ) -> dict[str, Any]:
    workers = [worker_row(w) for w in await api.workers()]
    health = await api.health()
    programs, total = await api.programs(limit=20)
    now = time.time()
    alerts = alerts_of(workers, health)
    span = hc.RANGES[range_name]
    try:
        history = await charts.history(api, range_name, now)
        recent = await api.events(since=-hc.CRASH_WINDOW_S, limit=500,
                                  kinds=hc.FAILURE_KINDS + hc.CRASH_KINDS)
        events = await api.events(since=-hc.RANGES["day"], limit=EVENTS_SHOWN)
    except ApiError as exc:
        if exc.status == 401:
            raise
        alerts.append(f"history unavailable: the daemon answered {exc.status}: {exc.message}")
        history, recent, events = {}, [], []
    alerts += hc.recent_alerts(recent, now)
    return {
        "ts": now, "workers": workers, "alerts": alerts,
        "queued": health.get("queued", 0), "programs_total": total,
        "programs": [program_row(p) for p in programs],
        "policies": await active_policies(api), "range": range_name,
        "ranges": list(hc.RANGES), "charts": hc.charts_of(history, now, span),
        "events": [hc.event_row(e) for e in events],
    }
