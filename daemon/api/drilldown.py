"""One request or one worker by id, whether the daemon still holds it or only the store
does: the consoles' detail pages open for every object in every state.

A request lives in memory while it runs and is forgotten once it ends; a worker stays in
memory while it is registered, its row stays in the store until the daemon restarts, and
after that only the requests that ran on it remember it. Each view says which it is
(`live`). The tenancy guard (daemon/api/tenants.require_owner) checks `request_id`; a
worker is shared by every tenant, so its list of requests is filtered to the caller's.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get
from litestar.params import Parameter

from daemon.access.auth import READ
from daemon.api.rest import worker_view
from daemon.api.tenants import access_of
from daemon.core.core import Core
from daemon.errors import ApiError
from daemon.state import RequestState, RequestStatus
from db import content_store
from db import repositories as repo

WORKER_REQUESTS = 50  # a worker page lists this many of its newest requests by default

_RUNNING = (RequestStatus.QUEUED, RequestStatus.RUNNING)
# What a running request has that its stored row may not have caught up with yet.
_LIVE_REQUEST_FIELDS = ("worker_id", "dispatched_at", "first_token_at", "finished_at",
                        "prompt_tokens", "cached_tokens", "output_tokens", "failovers")


class DrilldownController(Controller):
    path = "/v1"
    tags = ["agentd"]
    opt = {"scope": READ}

    @get("/requests/{request_id:str}", summary="One request, running or on record")
    async def request(self, core: Core, request_id: str) -> dict[str, Any]:
        await core.writer.flush()
        async with core.sessions() as s:
            row = await repo.get_request(s, request_id)
            # what it said and answered, where its tenant traces content (daemon/content/)
            content = await content_store.get_content(s, request_id)
        if row is None:
            raise ApiError(404, f"unknown request '{request_id}'", "not_found",
                           param="request_id")
        return {**_live_request(core.requests.get(request_id), row), "content": content}

    @get("/workers/{worker_id:str}",
         summary="One worker: live stats, or what the store remembers of it; its requests")
    async def worker(
        self, core: Core, request: Request[Any, Any, Any], worker_id: str,
        limit: int = Parameter(default=WORKER_REQUESTS, ge=1, le=1000),
    ) -> dict[str, Any]:
        await core.writer.flush()
        async with core.sessions() as s:
            stored = await repo.get_worker(s, worker_id)
            requests, total = await repo.worker_requests(s, worker_id, limit,
                                                         access_of(request).tenant)
        live = core.workers.get(worker_id)
        if live is not None:
            view = {**worker_view(live), "live": True}
        elif stored is not None:
            view = {**stored, "live": False, "inflight": 0, "stats": None}
        elif total:  # registered before the last restart: its requests remember it
            view = {"id": worker_id, "status": "gone", "live": False, "engine": None,
                    "model": None, "stats": None, "inflight": 0}
        else:
            raise ApiError(404, f"unknown worker '{worker_id}'", "not_found",
                           param="worker_id")
        return {**view, "requests": requests, "requests_total": total}


def _live_request(live: RequestState | None, row: dict[str, Any]) -> dict[str, Any]:
    """The stored row, with the running request's newer figures over it. An ended
    request the daemon still holds for a while is on record: its row is final."""
    if live is None or live.status not in _RUNNING:
        return {**row, "live": False}
    newer = {f: getattr(live, f) for f in _LIVE_REQUEST_FIELDS}
    return {**row, **newer, "status": live.status.value, "live": True}
