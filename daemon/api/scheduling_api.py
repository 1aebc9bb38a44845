"""The SLO scheduling stack over REST: what runs now, and the trace of its decisions.

Ordering switches, rollbacks, the emergency bypass, the LLM meta selector's decisions
(`meta.llm`: what each rested on) and policy changes concern no one session, so they are
daemon-level trace events (no session id) and the session trace does not show them;
`GET /v1/scheduling/trace` does. Admission refusals concern one request and are in its
session's trace. The status names the tenants' weights, SLO overrides and attainment.
Its window metrics are those of the long view the meta loop last built off the event loop
(`window.view` says when it was taken and how the builds went): a poll builds none.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Controller, Request, get
from litestar.params import Parameter
from sqlalchemy import or_, select

from daemon.access.auth import READ
from daemon.api.tenants import access_of
from daemon.core.core import Core
from daemon.errors import ApiError
from db import models
from db.repositories import as_dict

KIND_PREFIXES = ("ordering.", "meta.", "policy.", "admission.")


class SchedulingController(Controller):
    path = "/v1/scheduling"
    tags = ["scheduling"]

    @get("/", opt={"scope": READ},
         summary="Active policy per layer, bypass, per-worker controls, window SLO metrics")
    async def status(self, core: Core, request: Request[Any, Any, Any]) -> dict[str, Any]:
        status = core.slo.status(time.time())
        own = access_of(request).tenant
        if own is not None:  # other tenants' names, weights and attainment are theirs
            status["tenants"] = {key: _only(own, value)
                                 for key, value in status["tenants"].items()}
        return status

    @get("/trace", opt={"scope": READ},
         summary="Daemon-level scheduling decisions (switches, rollbacks, bypass, policy "
                 "changes), oldest first")
    async def trace(
        self, core: Core,
        after: int = Parameter(default=0, ge=0, le=2**62,
                               description="return events with id > after"),
        limit: int = Parameter(default=500, ge=1, le=5000),
        kind: str = Parameter(default="", max_length=64,
                              description="only kinds starting with this, e.g. ordering."),
    ) -> dict[str, Any]:
        if kind and not kind.startswith(KIND_PREFIXES):
            raise ApiError(400, f"kind must start with one of {', '.join(KIND_PREFIXES)}",
                           param="kind")
        await core.writer.flush()
        prefixes = (kind,) if kind else KIND_PREFIXES
        query = (select(models.TraceEvent)
                 .where(models.TraceEvent.session_id.is_(None), models.TraceEvent.id > after)
                 .where(_any_prefix(prefixes)).order_by(models.TraceEvent.id).limit(limit))
        async with core.sessions() as s:
            events = [as_dict(r) for r in await s.scalars(query)]
        next_after = events[-1]["id"] if len(events) == limit else None
        return {"data": events, "next_after": next_after}


def _only(tenant: str, figures: dict[str, Any] | list[str]) -> dict[str, Any] | list[str]:
    if isinstance(figures, dict):
        return {t: v for t, v in figures.items() if t == tenant}
    return [t for t in figures if t == tenant]


def _any_prefix(prefixes: tuple[str, ...]) -> Any:
    return or_(*(models.TraceEvent.kind.startswith(p, autoescape=True) for p in prefixes))
