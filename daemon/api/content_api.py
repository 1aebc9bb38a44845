"""Content tracing's reads: a session's export (JSON, or a Perfetto / Chrome trace file)
and token totals with cost per tenant. A request's content is in GET /v1/requests/{id}
(daemon/api/drilldown.py); a session's and a program's totals in their own GETs
(daemon/api/rest.py); text search in GET /v1/sessions.

Tenancy (daemon/api/tenants.py): the export names `session_id` in its path, so
`require_owner` answers 404 for another tenant's session; the usage of a non-operator
token is its own tenant's only.
"""

from __future__ import annotations

import asyncio
import math
from datetime import datetime
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.params import Parameter

from daemon.access.auth import READ, SUBMIT
from daemon.api.tenants import access_of
from daemon.content import otlp
from daemon.content import settings as content_settings
from daemon.content.export import perfetto
from daemon.content.usage import usage
from daemon.core.core import Core
from daemon.errors import ApiError
from db import content_store
from db import repositories as repo

EXPORT_FORMATS = ("json", "perfetto")
OTLP_TIMEOUT_S = 10.0
MAX_EXPORT_EVENTS = 100_000  # trace events in one export; `trace_truncated` says if cut


def time_bound(value: str | None, name: str, now: float) -> float | None:
    """A time parameter: unix seconds, negative seconds before now (-3600), or an ISO 8601
    time (2026-11-28T13:00:00Z); None when not given."""
    if value is None or value == "":
        return None
    try:
        t = float(value)
    except ValueError:
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            raise ApiError(400, f"{name} must be unix seconds, negative seconds before now "
                           f"(e.g. -3600) or an ISO 8601 time, got {value!r}",
                           param=name) from None
    if not math.isfinite(t):
        raise ApiError(400, f"{name} must be a finite number, got {value!r}", param=name)
    return now + t if t < 0 else t


def settings_of(core: Core) -> content_settings.ContentSettings:
    return content_settings.from_config(core.config)


class ContentController(Controller):
    path = "/v1"
    tags = ["agentd"]
    opt = {"scope": READ}

    @get("/sessions/{session_id:str}/export",
         summary="A session's record: JSON (programs, requests with stored content, trace) "
                 "or a Perfetto / Chrome trace file")
    async def export(
        self, core: Core, session_id: str,
        format: str = Parameter(default="json", description=" | ".join(EXPORT_FORMATS)),
    ) -> Response[dict[str, Any]]:
        if format not in EXPORT_FORMATS:
            raise ApiError(400, f"format must be one of {', '.join(EXPORT_FORMATS)}, "
                           f"got {format!r}", param="format")
        await core.writer.flush()
        async with core.sessions() as s:
            record = await content_store.session_record(s, session_id, MAX_EXPORT_EVENTS)
            totals = await content_store.session_totals(s, session_id)
        if record is None:
            raise ApiError(404, f"unknown session '{session_id}'", "not_found",
                           param="session_id")
        if format == "perfetto":
            body = perfetto(record, core.clock())
            name = f"{session_id}.perfetto.json"
        else:
            body = {**record, "usage": usage(totals, settings_of(core).prices),
                    "exported_at": core.clock()}
            name = f"{session_id}.json"
        return Response(body, headers={
            "Content-Disposition": f'attachment; filename="{_safe(name)}"'})

    @get("/sessions/{session_id:str}/contents",
         summary="A session's stored request contents (content tracing), oldest first")
    async def contents(
        self, core: Core, session_id: str,
        limit: int = Parameter(default=100, ge=1, le=1000,
                               description="the newest this many"),
        program_id: str | None = Parameter(default=None, max_length=256,
                                           description="only this program's requests"),
    ) -> dict[str, Any]:
        await core.writer.flush()
        async with core.sessions() as s:
            if await repo.get_session(s, session_id) is None:
                raise ApiError(404, f"unknown session '{session_id}'", "not_found",
                               param="session_id")
            rows, total = await content_store.session_contents(s, session_id, limit,
                                                               program_id)
        return {"data": rows, "total": total}

    @post("/sessions/{session_id:str}/export/otlp", status_code=200, opt={"scope": SUBMIT},
          summary="Send a session's spans (OpenTelemetry GenAI conventions) to the "
                  "configured OTLP endpoint")
    async def export_otlp(self, core: Core, session_id: str) -> dict[str, Any]:
        endpoint = core.config.otlp_endpoint
        if not endpoint:
            raise ApiError(409, "no OTLP endpoint is configured (otlp_endpoint)",
                           "not_configured", param="otlp_endpoint")
        await core.writer.flush()
        async with core.sessions() as s:
            record = await content_store.session_record(s, session_id, MAX_EXPORT_EVENTS)
        if record is None:
            raise ApiError(404, f"unknown session '{session_id}'", "not_found",
                           param="session_id")
        try:
            # the SDK's exporter posts and retries synchronously: off the event loop
            spans = await asyncio.to_thread(otlp.send, record, core.clock(), endpoint,
                                            core.config.otlp_headers, OTLP_TIMEOUT_S)
        except otlp.OtlpError as exc:
            raise ApiError(502, str(exc), "otlp_failed") from None
        return {"session_id": session_id, "spans": spans, "endpoint": endpoint}

    @get("/usage", summary="Token totals and cost per tenant (a tenant token: its own)")
    async def tenant_usage(self, core: Core, request: Request[Any, Any, Any]) -> dict[str, Any]:
        await core.writer.flush()
        async with core.sessions() as s:
            by_tenant = await content_store.tenant_totals(s, access_of(request).tenant)
        prices = settings_of(core).prices
        return {"data": [{"tenant": t, **usage(lines, prices)}
                         for t, lines in by_tenant.items()]}


def _safe(name: str) -> str:
    """A file name fit for a header: ids may hold any printable character."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
