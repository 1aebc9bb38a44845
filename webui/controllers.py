"""Login, the overview, the programs and sessions tables, a session's page and its actions.

Every page reads the daemon's public REST API as the logged-in user (see webui.web);
the live parts are server-sent event streams that re-read the same API every second.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Response, get, post
from litestar.response import Redirect, ServerSentEvent, ServerSentEventMessage

from webui.client import Api, ApiError, seg
from webui.futuregraph import layout as graph_layout
from webui.history_charts import range_of
from webui.overview import ChartCache, program_row, snapshot, worker_row
from webui.timeline import ZOOMS, layout
from webui.web import (
    Form,
    FormError,
    Req,
    api_base,
    csrf_ok,
    error_page,
    form_action,
    int_param,
    qall,
    render,
    safe_next,
    token_of,
    with_api,
)

STATUSES = ("QUEUED", "REASONING", "ACTING", "PAUSED", "STOPPED", "FAILED")
PROGRAM_ACTIONS = ("release", "pause", "resume", "kill", "migrate")
PAGE_SIZE = 25
CONTENT_ROWS = 50  # a session page shows its newest this many stored request contents
SESSION_PROGRAMS = 1000  # a session page follows up to this many of its programs
PROGRAM_SORTS = ("created_at", "id", "session_id", "status", "worker_id", "context_tokens",
                 "steps")  # the columns GET /v1/programs sorts by
SESSION_SORTS = ("created_at", "updated_at", "id", "tenant", "priority", "programs")
SSE_INTERVAL_S = 1.0

Fetch = Callable[[Api], Awaitable[dict[str, Any]]]


def charts_of(request: Req) -> ChartCache:
    charts = request.route_handler.opt["ui_history"]
    assert isinstance(charts, ChartCache)
    return charts


def poll_stream(request: Req, fetch: Fetch, event: str = "snapshot") -> Response[Any]:
    """Server-sent events: `fetch` again every SSE_INTERVAL_S while the page is open."""
    token = token_of(request)
    if token is None:
        return Response({"error": "log in first"}, status_code=401)
    base = api_base(request)

    async def stream() -> AsyncIterator[ServerSentEventMessage]:
        async with Api(base, token) as api:
            while True:
                try:
                    data = await fetch(api)
                except ApiError as exc:
                    yield ServerSentEventMessage(data=json.dumps(
                        {"status": exc.status, "message": exc.message}), event="failure")
                    if exc.status in (401, 403, 404):
                        return
                else:
                    yield ServerSentEventMessage(data=json.dumps(data), event=event)
                await asyncio.sleep(SSE_INTERVAL_S)

    return ServerSentEvent(stream())


# --- login -------------------------------------------------------------------------------


@get("/login", name="ui.login")
async def login_page(request: Req) -> Response[str]:
    return render(request, "login.html", title="Log in", next=safe_next(
        request.query_params.get("next")), error=None)


@post("/login", status_code=303)
async def login(request: Req) -> Response[Any]:
    form = await request.form()
    nxt = safe_next(form.get("next"))
    if not csrf_ok(request, form):
        return render(request, "login.html", status=403, title="Log in", next=nxt,
                      error="The form expired; please try again.")
    token = str(form.get("token") or "").strip()
    error = None
    scopes: list[str] = []
    if not token:
        error = "Enter an API token."
    else:
        async with Api(api_base(request), token) as api:
            try:
                await api.workers()
                scopes = [str(s) for s in (await api.whoami())["scopes"]]
            except ApiError as exc:
                error = ("That token is not valid (unknown or revoked)." if exc.status == 401
                         else f"That token cannot read the daemon: {exc.message}")
    if error:
        return render(request, "login.html", status=401, title="Log in", next=nxt,
                      error=error)
    # A fresh session (and CSRF token) for the logged-in user; its scopes decide which
    # actions the pages offer.
    request.set_session({"token": token, "csrf": secrets.token_urlsafe(32),
                         "scopes": scopes})
    return Redirect(nxt, status_code=303)


@post("/logout", status_code=303)
async def logout(request: Req) -> Response[Any]:
    form = await request.form()
    if not csrf_ok(request, form):
        return error_page(request, 403, "missing or wrong CSRF token")
    request.clear_session()
    return Redirect("/ui/login", status_code=303)


# --- overview ----------------------------------------------------------------------------


@get("/", name="ui.overview")
async def overview(request: Req) -> Response[Any]:
    """?range=hour|day: the span the history charts show."""
    charts, span = charts_of(request), range_of(request.query_params.get("range"))

    async def page(api: Api) -> Response[Any]:
        return render(request, "overview.html", title="Overview",
                      snap=await snapshot(api, charts, span))

    return await with_api(request, page)


@get("/events", name="ui.events")
async def events(request: Req) -> Response[Any]:
    charts, span = charts_of(request), range_of(request.query_params.get("range"))
    return poll_stream(request, lambda api: snapshot(api, charts, span))


# --- programs and sessions ---------------------------------------------------------------


def _table_params(q: Any, sorts: tuple[str, ...]) -> dict[str, Any]:
    sort = str(q.get("sort") or "created_at")
    return {"sort": sort if sort in sorts else "created_at",
            "desc": q.get("dir", "desc") != "asc", "page": int_param(q.get("page"), 1)}


def _pages(total: int, page: int) -> dict[str, Any]:
    return {"page": page, "pages": max(1, -(-total // PAGE_SIZE)), "total": total}


async def programs_table(api: Api, q: Any) -> dict[str, Any]:
    """The programs page's rows for query `q`: filter, sort, page (also its live feed)."""
    t = _table_params(q, PROGRAM_SORTS)
    status = str(q.get("status") or "").upper()
    status = status if status in STATUSES else ""
    session = str(q.get("session") or "")
    if q.get("all") == "1":  # a session page follows every program of its session
        rows, total = await api.programs(status or None, session or None, SESSION_PROGRAMS, 0,
                                         t["sort"], t["desc"])
    else:
        rows, total = await api.programs(status or None, session or None, PAGE_SIZE,
                                         (t["page"] - 1) * PAGE_SIZE, t["sort"], t["desc"])
    return {"rows": [program_row(r) for r in rows], "status_filter": status,
            "session": session, **t, **_pages(total, t["page"])}


@get("/programs", name="ui.programs")
async def programs_page(request: Req) -> Response[Any]:
    async def page(api: Api) -> Response[Any]:
        table = await programs_table(api, request.query_params)
        return render(request, "programs.html", title="Programs", statuses=STATUSES,
                      sorts=PROGRAM_SORTS, **table)

    return await with_api(request, page)


@get("/programs/live", name="ui.programs.live")
async def programs_live(request: Req) -> Response[Any]:
    q = request.query_params
    return poll_stream(request, lambda api: programs_table(api, q), event="programs")


@get("/sessions", name="ui.sessions")
async def sessions_page(request: Req) -> Response[Any]:
    q = request.query_params
    t = _table_params(q, SESSION_SORTS)
    tenant = str(q.get("tenant") or "").strip()
    contains = str(q.get("q") or "").strip()

    async def page(api: Api) -> Response[Any]:
        rows, total = await api.sessions(PAGE_SIZE, (t["page"] - 1) * PAGE_SIZE, contains,
                                          tenant, t["sort"], t["desc"])
        return render(request, "sessions.html", title="Sessions", rows=rows,
                      sorts=SESSION_SORTS, tenant=tenant, contains=contains,
                      **{**t, **_pages(total, t["page"])})

    return await with_api(request, page)


# --- one session -------------------------------------------------------------------------


@get("/session", name="ui.session")
async def session_page(request: Req) -> Response[Any]:
    """One session: its programs with actions, its trace as a timeline, its futures as a
    graph, its managed state. The id travels in the query (?id=) so any id has a page."""
    session_id = str(request.query_params.get("id") or "")
    zoom = int_param(request.query_params.get("zoom"), 1)
    zoom = zoom if zoom in ZOOMS else 1

    async def page(api: Api) -> Response[Any]:
        session = await api.session(session_id)
        # Programs the daemon has let go of come from the store without the live-only
        # fields (held...): program_row gives every program the same fields.
        session["programs"] = [program_row(p) for p in session["programs"]]
        trace = await api.trace(session_id)
        workers = [worker_row(w) for w in await api.workers()]
        runs = [r for r in await runs_or_none(api) if r.get("session_id") == session_id]
        # what its requests said and answered, where its tenant traces content
        contents = await api.get(f"/v1/sessions/{qall(session_id)}/contents",
                                 limit=CONTENT_ROWS)
        live = any(p.get("status") not in ("STOPPED", "FAILED") for p in session["programs"])
        here = f"/ui/session?id={qall(session_id)}"
        return render(
            request, "session.html", title=f"Session {session_id}", session=session,
            timeline=layout(trace, now=time.time() if live else None, zoom=zoom),
            graph=graph_layout(trace), events=trace[-200:], workers=workers, runs=runs,
            zooms=ZOOMS, zoom=zoom, here=here + (f"&zoom={zoom}" if zoom > 1 else ""),
            base=here, live=live, contents=contents["data"], contents_total=contents["total"])

    return await with_api(request, page)


async def runs_or_none(api: Api) -> list[dict[str, Any]]:
    try:
        return await api.runs()
    except ApiError as exc:
        if exc.status == 503:  # the workflow runtime is not started in this daemon
            return []
        raise


@post("/actions/program", status_code=303)
async def program_action(request: Req) -> Response[Any]:
    return await form_action(request, _program_action, lambda f: _describe(f, "program"))


@post("/actions/session", status_code=303)
async def session_action(request: Req) -> Response[Any]:
    return await form_action(request, _session_migrate, lambda f: _describe(f, "session"))


def _describe(form: Form, target: str) -> str:
    action = "migrate" if target == "session" else str(form.get("action") or "act on")
    return f"{action} {target} {form.get('id') or ''}"


async def _program_action(api: Api, form: Form) -> tuple[str, str | None]:
    action = str(form.get("action") or "")
    if action not in PROGRAM_ACTIONS:
        raise FormError(f"action must be one of {', '.join(PROGRAM_ACTIONS)}")
    return await _act(api, form, "programs", action)


async def _session_migrate(api: Api, form: Form) -> tuple[str, str | None]:
    return await _act(api, form, "sessions", "migrate")


async def _act(api: Api, form: Form, kind: str, action: str) -> tuple[str, str | None]:
    object_id = str(form.get("id") or "")
    worker_id = str(form.get("worker_id") or "")
    if not object_id:
        raise FormError("id: missing")
    if action == "migrate" and not worker_id:
        raise FormError("worker_id: choose a target worker")
    body = {"worker_id": worker_id, "now": form.get("now") == "1"} if action == "migrate" \
        else None
    await api.post(f"/v1/{kind}/{seg(object_id)}/{action}", body)
    done = f" to {worker_id}" if action == "migrate" else ""
    return f"{action} {kind[:-1]} {object_id}{done}: done", None
