"""REST API for the consoles: workers, programs, sessions, traces, health, metrics."""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import Parameter

from daemon.access.auth import OPERATOR, PUBLIC, READ, SUBMIT, principal_of
from daemon.api.content_api import settings_of, time_bound
from daemon.api.errors import decode_body
from daemon.api.tenants import access_of
from daemon.content.usage import usage
from daemon.core import operations
from daemon.core.core import Core
from daemon.errors import ApiError
from daemon.metrics import CONTENT_TYPE
from daemon.state import WorkerState
from db import content_store
from db import repositories as repo
from db.session_search import SESSION_SORTS, SessionQuery, search_sessions

_TIME_HELP = ("active from/until: unix seconds, negative seconds before now, or ISO 8601; "
              "a session is active when created, or a request of it queued, in the range")
_STATUSES = ("QUEUED", "REASONING", "ACTING", "PAUSED", "STOPPED", "FAILED")


def worker_view(w: WorkerState) -> dict[str, Any]:
    stats = w.stats
    return {
        "id": w.id, "engine": w.engine, "model": w.model, "status": w.status,
        "kv_capacity_tokens": w.kv_capacity_tokens, "block_size": w.block_size,
        "max_batch": w.max_batch, "pid": w.pid, "host": w.host, "node": w.node,
        "dp_rank": w.dp_rank,
        "inflight": len(w.inflight), "last_seen_s_ago": round(time.time() - w.last_seen, 3),
        "stats": None if stats is None else {
            f: getattr(stats, f) for f in stats.__struct_fields__},
    }


class ReleaseIdleBody(msgspec.Struct, forbid_unknown_fields=True):
    idle_s: Annotated[float, msgspec.Meta(ge=0)]  # quiet for at least this long
    dry_run: bool = False  # only list them
    tenant: str | None = None  # an operator's choice; another token releases its own


class MigrateBody(msgspec.Struct, forbid_unknown_fields=True):
    worker_id: str
    now: bool = False


def _who(request: Request[Any, Any, Any]) -> str:
    principal = principal_of(request)
    return principal.name if principal is not None else "operator"


class OperatorController(Controller):
    """Operator actions: they change scheduling, so they need the operator scope."""

    path = "/v1"
    tags = ["operator"]
    opt = {"scope": OPERATOR}

    @post("/programs/{program_id:str}/migrate", status_code=200,
          summary="Move a program's next requests to a worker and pin it there")
    async def migrate_program(self, core: Core, request: Request[Any, Any, Any],
                              program_id: str) -> dict[str, Any]:
        body = decode_body(await request.body(), MigrateBody)
        moved = await operations.migrate(core, [program_id], body.worker_id, body.now,
                                         _who(request))
        return {"data": moved}

    @post("/sessions/{session_id:str}/migrate", status_code=200,
          summary="Move every live program of a session to a worker and pin them")
    async def migrate_session(self, core: Core, request: Request[Any, Any, Any],
                              session_id: str) -> dict[str, Any]:
        body = decode_body(await request.body(), MigrateBody)
        await core.writer.flush()
        async with core.sessions() as s:
            session = await repo.get_session(s, session_id)
        if session is None:
            raise ApiError(404, f"unknown session '{session_id}'", "not_found")
        live = [p["id"] for p in session["programs"]
                if _live(core, p)["status"] not in ("STOPPED", "FAILED")]
        moved = await operations.migrate(core, live, body.worker_id, body.now, _who(request))
        return {"data": moved}

    @post("/programs/{program_id:str}/pause", status_code=200,
          summary="Pause a program (after its running request) until resumed")
    async def pause(self, core: Core, request: Request[Any, Any, Any],
                    program_id: str) -> dict[str, Any]:
        program = await operations.pause(core, program_id, _who(request))
        return {"id": program.id, "status": program.status.value, "held": True,
                "pause_after_request": program.pause_marked}

    @post("/programs/{program_id:str}/resume", status_code=200,
          summary="Let the scheduler restore an operator-paused program")
    async def resume(self, core: Core, request: Request[Any, Any, Any],
                     program_id: str) -> dict[str, Any]:
        program = await operations.resume(core, program_id, _who(request))
        return {"id": program.id, "status": program.status.value, "held": False}

    @post("/programs/{program_id:str}/kill", status_code=200,
          summary="Abort a program's request and end it as FAILED")
    async def kill(self, core: Core, request: Request[Any, Any, Any],
                   program_id: str) -> dict[str, Any]:
        program = await operations.kill(core, program_id, _who(request))
        return {"id": program.id, "status": program.status.value}


class RestController(Controller):
    path = "/v1"
    tags = ["agentd"]
    opt = {"scope": READ}

    @get("/workers", summary="Engine workers and their live stats")
    async def workers(self, core: Core) -> dict[str, Any]:
        return {"data": [worker_view(w) for w in core.workers.values()]}

    @get("/programs", summary="Programs, newest first; filter by status or session, sort, page")
    async def programs(
        self, core: Core, request: Request[Any, Any, Any],
        status: str | None = None,
        session_id: str | None = Parameter(query="session", default=None),
        limit: int = Parameter(default=100, ge=1, le=1000),
        offset: int = Parameter(default=0, ge=0, le=2**62),
        sort: str = Parameter(default="created_at", description=", ".join(repo.PROGRAM_SORTS)),
        order: str = Parameter(default="desc", description="asc or desc"),
    ) -> dict[str, Any]:
        if status is not None and status.upper() not in _STATUSES:
            raise ApiError(400, f"status must be one of {', '.join(_STATUSES)}", param="status")
        if sort not in repo.PROGRAM_SORTS:
            raise ApiError(400, f"sort must be one of {', '.join(repo.PROGRAM_SORTS)}",
                           param="sort")
        if order not in ("asc", "desc"):
            raise ApiError(400, "order must be asc or desc", param="order")
        await core.writer.flush()
        async with core.sessions() as s:
            rows, total = await repo.list_programs(s, status, session_id, limit, offset,
                                                   sort, order == "desc",
                                                   access_of(request).tenant)
        return {"data": [_live(core, r) for r in rows], "total": total}

    @get("/programs/{program_id:str}", summary="One program with its requests")
    async def program(self, core: Core, program_id: str) -> dict[str, Any]:
        await core.writer.flush()
        async with core.sessions() as s:
            row = await repo.get_program(s, program_id)
            totals = await content_store.program_totals(s, program_id)
        if row is None:
            raise ApiError(404, f"unknown program '{program_id}'", "not_found")
        return {**_live(core, row), "usage": usage(totals, settings_of(core).prices)}

    @post("/programs/release-idle", status_code=200, opt={"scope": SUBMIT},
          summary="End every program idle for at least idle_s (a tenant's own; an "
                  "operator's: all, or one tenant's)")
    async def release_idle(self, core: Core, request: Request[Any, Any, Any]
                           ) -> dict[str, Any]:
        body = decode_body(await request.body(), ReleaseIdleBody)
        own = access_of(request).tenant
        if own is not None and body.tenant not in (None, own):
            raise ApiError(403, f"tenant: only an operator token may name another tenant; "
                           f"this token's is '{own}'", "tenant_not_allowed", param="tenant")
        ended = await core.expiry.release_idle(body.idle_s, own or body.tenant,
                                               _who(request), body.dry_run)
        now = core.expiry.clock()
        return {"data": [{"id": q.program_id, "tenant": q.tenant, "timeout_s": q.timeout_s,
                          "idle_s": round(q.idle_s(now), 3)} for q in ended],
                "released": 0 if body.dry_run else len(ended), "dry_run": body.dry_run}

    @post("/programs/{program_id:str}/release", status_code=200, opt={"scope": SUBMIT},
          summary="End a program: STOPPED, its resources released")
    async def release(self, core: Core, program_id: str) -> dict[str, Any]:
        program = await core.release_program(program_id)
        return {"id": program.id, "status": program.status.value}

    @get("/sessions", summary="Sessions, newest first; search by text (id or stored "
                              "content), tenant, program status and time range; sort, page")
    async def sessions(
        self, core: Core, request: Request[Any, Any, Any],
        limit: int = Parameter(default=100, ge=1, le=1000),
        offset: int = Parameter(default=0, ge=0, le=2**62),
        q: str = Parameter(default="", max_length=128,
                           description="the id, or a stored prompt, completion or tool call "
                                       "of its requests, contains (any case)"),
        tenant: str = Parameter(default="", max_length=128),
        sort: str = Parameter(default="created_at", description=", ".join(SESSION_SORTS)),
        order: str = Parameter(default="desc", description="asc or desc"),
        since: str | None = Parameter(default=None, description=_TIME_HELP),
        until: str | None = Parameter(default=None, description=_TIME_HELP),
        status: str = Parameter(default="", description="holding a program in this status: "
                                                        + ", ".join(_STATUSES)),
    ) -> dict[str, Any]:
        if status and status.upper() not in _STATUSES:
            raise ApiError(400, f"status must be one of {', '.join(_STATUSES)}", param="status")
        now = time.time()
        after, before = time_bound(since, "since", now), time_bound(until, "until", now)
        if after is not None and before is not None and after > before:
            raise ApiError(400, "until must not be before since", param="until")
        if sort not in SESSION_SORTS:
            raise ApiError(400, f"sort must be one of {', '.join(SESSION_SORTS)}", param="sort")
        if order not in ("asc", "desc"):
            raise ApiError(400, "order must be asc or desc", param="order")
        own = access_of(request).tenant
        if own is not None:
            if tenant not in ("", own):
                return {"data": [], "total": 0}  # another tenant's sessions: none visible
            tenant = own
        await core.writer.flush()
        async with core.sessions() as s:
            rows, total = await search_sessions(
                s, SessionQuery(q, tenant, sort, order == "desc", after, before,
                                status.upper()), limit, offset)
        return {"data": rows, "total": total}

    @get("/sessions/{session_id:str}", summary="One session with its programs")
    async def session(self, core: Core, session_id: str) -> dict[str, Any]:
        await core.writer.flush()
        async with core.sessions() as s:
            row = await repo.get_session(s, session_id)
            totals = await content_store.session_totals(s, session_id)
        if row is None:
            raise ApiError(404, f"unknown session '{session_id}'", "not_found")
        row["programs"] = [_live(core, p) for p in row["programs"]]
        row["usage"] = usage(totals, settings_of(core).prices)
        return row

    @get("/sessions/{session_id:str}/trace", summary="The session's trace events, oldest first")
    async def trace(
        self, core: Core, session_id: str,
        after: int = Parameter(default=0, ge=0, le=2**62,
                               description="return events with id > after"),
        limit: int = Parameter(default=500, ge=1, le=5000),
    ) -> dict[str, Any]:
        await core.writer.flush()
        async with core.sessions() as s:
            if await repo.get_session(s, session_id) is None:
                raise ApiError(404, f"unknown session '{session_id}'", "not_found")
            events = await repo.trace_events(s, session_id, after, limit)
        next_after = events[-1]["id"] if len(events) == limit else None
        return {"data": events, "next_after": next_after}


def _live(core: Core, row: dict[str, Any]) -> dict[str, Any]:
    """Overlay the in-memory state, which is newer than the last flush."""
    live = core.programs.get(row["id"])
    if live is not None:
        row.update(status=live.status.value, worker_id=live.worker_id,
                   context_tokens=live.context_tokens, steps=live.steps,
                   active_request=live.active_request, pinned=live.pinned, held=live.held,
                   kv_residency=core.kv.residency_of(live))
    return row


class OpsController(Controller):
    tags = ["ops"]

    @get("/healthz", opt={"scope": PUBLIC}, summary="Liveness and a short status")
    async def healthz(self, core: Core) -> Response[dict[str, Any]]:
        healthy = sum(1 for w in core.workers.values() if w.healthy)
        ok = core.writer.last_error is None
        body = {"status": "ok" if ok else "degraded", "workers_healthy": healthy,
                "workers": len(core.workers), "queued": len(core.queue),
                # No token is needed here, and a store error's text can quote SQL
                # parameters (users' data): its kind only; the log has the rest.
                "store_error": None if ok else _error_kind(core.writer.last_error)}
        return Response(body, status_code=200 if ok else 503)

    @get("/metrics", media_type=CONTENT_TYPE, opt={"scope": READ}, summary="Prometheus metrics")
    async def metrics(self, core: Core) -> bytes:
        """prometheus_client's text format from this daemon's registry (daemon/metrics.py)."""
        return core.metrics.render()


def _error_kind(error: str | None) -> str:
    return f"{(error or '').partition(':')[0] or 'error'} (see the daemon's log)"
