"""GET /v1/history and GET /v1/events: the daemon's own sampled series and its event log,
from the store, so an operator arriving after an incident sees it (daemon/history/).

Tenancy (daemon/api/tenants.py): the series are cluster-wide aggregates (rates, latency
percentiles, KV use per worker, queue length) of the kind /metrics, /v1/workers and
/v1/scheduling already show every read token, and hold no tenant's object or content, so
every reader gets them. An event a tenant's request or program caused carries its tenant
and is shown to that tenant only (and operators); an event of no tenant (a worker's crash,
a policy switch, a daemon restart, failovers and 5xx answers counted per worker or in all)
names no tenant's object (daemon/history/events.py keeps no session, program or request
id in it), so it is shown to every reader, as the worker's status and the active policy
are.
"""

from __future__ import annotations

import math
from typing import Any

from litestar import Controller, Request, get
from litestar.params import Parameter

from daemon.access.auth import READ
from daemon.api.tenants import access_of
from daemon.errors import ApiError
from daemon.history import tiers
from daemon.history.events import KINDS
from daemon.history.sampler import SERIES
from daemon.history.service import History
from db import history_store

DEFAULT_SPAN_S = 3600.0
DEFAULT_EVENTS_SPAN_S = 86400.0
DEFAULT_EVENTS, MAX_EVENTS = 100, 1000


def _time(value: str | None, name: str, default: float, now: float) -> float:
    """Unix seconds, or seconds relative to now when negative (since=-3600)."""
    if value is None or value == "":
        return default
    try:
        t = float(value)
    except ValueError:
        raise ApiError(400, f"{name} must be unix seconds, or negative seconds before now "
                       f"(e.g. -3600), got {value!r}", param=name) from None
    if not math.isfinite(t):
        raise ApiError(400, f"{name} must be a finite number, got {value!r}", param=name)
    return now + t if t < 0 else t


def _names(value: str | None, name: str, known: list[str]) -> list[str] | None:
    if not value:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ApiError(400, f"{name}: unknown {', '.join(unknown)}; one or more of "
                       f"{', '.join(known)}", param=name)
    return names


def _limit(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_EVENTS
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_EVENTS:
        raise ApiError(400, f"limit must be an integer 1-{MAX_EVENTS}, got {value!r}",
                       param="limit")
    return n


class HistoryController(Controller):
    path = "/v1"
    tags = ["agentd"]
    opt = {"scope": READ}

    @get("/history", summary="The daemon's own series over a time range, from the store")
    async def history(
        self, history: History,
        series: str | None = Parameter(default=None, description=(
            "comma-separated series names; all when absent")),
        since: str | None = Parameter(default=None, description=(
            "unix seconds, or negative seconds before now; default -3600")),
        until: str | None = Parameter(default=None, description="as since; default now"),
        step: str | None = Parameter(default=None, description=(
            "seconds between points; default: the span in about 300 points")),
    ) -> dict[str, Any]:
        now = history.clock()
        names = _names(series, "series", list(SERIES))
        start = _time(since, "since", now - DEFAULT_SPAN_S, now)
        end = _time(until, "until", now, now)
        if start >= end:
            raise ApiError(400, "since must be before until", param="since")
        step_s = tiers.auto_step(start, end)
        if step:
            try:
                step_s = float(step)
            except ValueError:
                raise ApiError(400, f"step must be seconds, got {step!r}",
                               param="step") from None
            if not (math.isfinite(step_s) and step_s >= 1):
                raise ApiError(400, f"step must be >= 1 second, got {step!r}", param="step")
        body = await history.store.read(names, start, end, step_s)
        body["descriptions"] = {n: SERIES[n][0] for n in (names or SERIES)}
        return body

    @get("/events", summary="The operator event log: crashes, failovers, switches, "
                            "refusals (folded events land once per history interval)")
    async def events(
        self, history: History, request: Request[Any, Any, Any],
        since: str | None = Parameter(default=None, description=(
            "unix seconds, or negative seconds before now; default -86400")),
        kind: str | None = Parameter(default=None, description="comma-separated kinds"),
        limit: str | None = Parameter(default=None, description="1-1000; default 100"),
    ) -> dict[str, Any]:
        now = history.clock()
        count = _limit(limit)
        start = _time(since, "since", now - DEFAULT_EVENTS_SPAN_S, now)
        kinds = _names(kind, "kind", KINDS)
        await history.core.writer.flush()
        async with history.core.sessions() as s:
            rows = await history_store.events(s, start, kinds, count,
                                              tenant=access_of(request).tenant)
        return {"data": rows, "kinds": KINDS, "now": now}
