"""The web dashboard under /ui: server-rendered pages over the daemon's public REST API.

The UI holds no daemon internals: every page calls the REST API over HTTP with the API
token the user logged in with, which lives only in the server-side session (the browser
holds an opaque, HttpOnly, SameSite=Strict session id). The daemon's scope guard sees
the UI's own routes as public; the UI enforces its login itself and the API enforces the
token's scopes on every call the UI makes on the user's behalf.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from litestar import MediaType, Request, Response, Router, get, post
from litestar.datastructures import ResponseHeader
from litestar.middleware.session.server_side import ServerSideSessionConfig
from litestar.response import Redirect, ServerSentEvent, ServerSentEventMessage
from litestar.static_files import create_static_files_router

from webui.client import Api, ApiError
from webui.timeline import layout

HERE = Path(__file__).parent
STATUSES = ("QUEUED", "REASONING", "ACTING", "PAUSED", "STOPPED", "FAILED")
PROGRAM_ACTIONS = ("release", "pause", "resume", "kill", "migrate")
PAGE_SIZE = 25
SORT_WINDOW = 1000  # a non-default sort orders the newest this-many rows (the API's max page)
PROGRAM_SORTS = ("created_at", "id", "session_id", "status", "worker_id", "context_tokens",
                 "steps")
SESSION_SORTS = ("created_at", "updated_at", "id", "tenant", "priority", "programs")
SSE_INTERVAL_S = 1.0
# "public" tells the daemon's scope guard that these routes need no bearer token: the UI
# authenticates its users with its session, then calls the API with their token.
PUBLIC_SCOPE = "public"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,  # every template, every variable: ids are user-controlled
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _ago(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return ""
    delta = max(time.time() - ts, 0.0)
    if delta < 60:
        return f"{delta:.0f}s ago"
    if delta < 3600:
        return f"{delta / 60:.0f}m ago"
    return f"{delta / 3600:.1f}h ago"


_env.filters["ago"] = _ago


# --- session, CSRF, rendering ------------------------------------------------------------

Req = Request[Any, Any, Any]


def _api_base(request: Req) -> str:
    return str(request.route_handler.opt["ui_api_base"])


def _token(request: Req) -> str | None:
    token = request.session.get("token") if request.session else None
    return token if isinstance(token, str) else None


def _csrf(request: Req) -> str:
    session = request.session
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return token


def _csrf_ok(request: Req, form: Any) -> bool:
    sent = form.get("_csrf")
    held = request.session.get("csrf") if request.session else None
    return (isinstance(sent, str) and isinstance(held, str)
            and hmac.compare_digest(sent.encode(), held.encode()))


def _flash(request: Req, kind: str, text: str) -> None:
    request.session["flash"] = [kind, text]


def _safe_next(value: Any, default: str = "/ui/") -> str:
    """Only redirect to our own pages (no scheme, no host, no '//' tricks)."""
    if (isinstance(value, str) and value.startswith("/ui") and "//" not in value
            and "\\" not in value and all(32 < ord(c) < 127 for c in value)):
        return value
    return default


def _render(request: Req, template: str, status: int = 200, **context: Any) -> Response[str]:
    flash = request.session.pop("flash", None) if request.session else None
    html = _env.get_template(template).render(
        csrf=_csrf(request), flash=flash, logged_in=_token(request) is not None,
        path=request.url.path, query=str(request.url.query or ""), **context)
    return Response(html, status_code=status, media_type=MediaType.HTML)


def _login_redirect(request: Req) -> Redirect:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return Redirect(f"/ui/login?next={_quote(here)}", status_code=303)


def _quote(value: str) -> str:
    return quote(value, safe="/")


def _api_failure(request: Req, exc: ApiError) -> Response[Any]:
    if exc.status == 401:  # token revoked or expired: log out
        request.clear_session()
        return _login_redirect(request)
    return _render(request, "error.html", status=exc.status if exc.status >= 400 else 502,
                   title="Error", code=exc.status, message=exc.message)


# --- views over API rows -----------------------------------------------------------------


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
        "last_seen_s_ago": w.get("last_seen_s_ago"),
    }


def alerts_of(workers: list[dict[str, Any]], health: dict[str, Any]) -> list[str]:
    out = [f"worker {w['id']} is {w['status']}" for w in workers if not w["healthy"]]
    if not any(w["healthy"] for w in workers):
        out.append("no healthy worker: requests will wait in the queue")
    if health.get("status") not in (None, "ok"):
        out.append(f"daemon is {health.get('status')}: {health.get('store_error') or ''}")
    return out


async def snapshot(api: Api) -> dict[str, Any]:
    workers = [worker_row(w) for w in await api.workers()]
    health = await api.health()
    programs, total = await api.programs(limit=20)
    return {
        "ts": time.time(), "workers": workers, "alerts": alerts_of(workers, health),
        "queued": health.get("queued", 0), "programs_total": total,
        "programs": [{"id": p["id"], "session_id": p["session_id"], "status": p["status"],
                      "worker_id": p.get("worker_id"), "steps": p.get("steps", 0),
                      "context_tokens": p.get("context_tokens", 0)} for p in programs],
    }


def _sort_key(column: str) -> Any:
    def key(row: dict[str, Any]) -> tuple[int, Any]:
        value = row.get(column)
        if value is None:
            return (1, "")
        return (0, value if isinstance(value, int | float) else str(value).lower())
    return key


def _page_links(total: int, page: int) -> dict[str, Any]:
    pages = max(1, -(-total // PAGE_SIZE))
    return {"page": page, "pages": pages, "total": total}


def _int(value: Any, default: int, low: int = 1) -> int:
    try:
        return max(low, int(value))
    except (TypeError, ValueError):
        return default


# --- handlers ----------------------------------------------------------------------------


@get("/login", name="ui.login")
async def login_page(request: Req) -> Response[str]:
    return _render(request, "login.html", title="Log in", next=_safe_next(
        request.query_params.get("next")), error=None)


@post("/login", status_code=303)
async def login(request: Req) -> Response[Any]:
    form = await request.form()
    nxt = _safe_next(form.get("next"))
    if not _csrf_ok(request, form):
        return _render(request, "login.html", status=403, title="Log in", next=nxt,
                       error="The form expired; please try again.")
    token = str(form.get("token") or "").strip()
    error = None
    if not token:
        error = "Enter an API token."
    else:
        async with Api(_api_base(request), token) as api:
            try:
                await api.workers()
            except ApiError as exc:
                error = ("That token is not valid (unknown or revoked)." if exc.status == 401
                         else f"That token cannot read the daemon: {exc.message}")
    if error:
        return _render(request, "login.html", status=401, title="Log in", next=nxt,
                       error=error)
    # A fresh CSRF token for the logged-in session.
    request.set_session({"token": token, "csrf": secrets.token_urlsafe(32)})
    return Redirect(nxt, status_code=303)


@post("/logout", status_code=303)
async def logout(request: Req) -> Response[Any]:
    form = await request.form()
    if not _csrf_ok(request, form):
        return _render(request, "error.html", status=403, title="Error", message=
                       "missing or wrong CSRF token")
    request.clear_session()
    return Redirect("/ui/login", status_code=303)


@get("/", name="ui.overview")
async def overview(request: Req) -> Response[Any]:
    token = _token(request)
    if token is None:
        return _login_redirect(request)
    async with Api(_api_base(request), token) as api:
        try:
            snap = await snapshot(api)
        except ApiError as exc:
            return _api_failure(request, exc)
    return _render(request, "overview.html", title="Overview", snap=snap)


@get("/events", name="ui.events")
async def events(request: Req) -> Response[Any]:
    token = _token(request)
    if token is None:
        return Response({"error": "log in first"}, status_code=401)
    base = _api_base(request)

    async def stream() -> AsyncIterator[ServerSentEventMessage]:
        async with Api(base, token) as api:
            while True:
                try:
                    snap = await snapshot(api)
                except ApiError as exc:
                    yield ServerSentEventMessage(data=json.dumps({"status": exc.status,
                                                                 "message": exc.message}),
                                                 event="failure")
                    if exc.status in (401, 403):
                        return
                else:
                    yield ServerSentEventMessage(data=json.dumps(snap), event="snapshot")
                await asyncio.sleep(SSE_INTERVAL_S)

    return ServerSentEvent(stream())


@get("/programs", name="ui.programs")
async def programs_page(request: Req) -> Response[Any]:
    token = _token(request)
    if token is None:
        return _login_redirect(request)
    q = request.query_params
    status = str(q.get("status") or "").upper()
    status = status if status in STATUSES else ""
    session = str(q.get("session") or "")
    sort = str(q.get("sort") or "created_at")
    sort = sort if sort in PROGRAM_SORTS else "created_at"
    desc = q.get("dir", "desc") != "asc"
    page = _int(q.get("page"), 1)
    async with Api(_api_base(request), token) as api:
        try:
            if sort == "created_at" and desc:  # the API's own order: page through it
                rows, total = await api.programs(status or None, session or None, PAGE_SIZE,
                                                 (page - 1) * PAGE_SIZE)
            else:
                rows, total = await api.programs(status or None, session or None,
                                                 SORT_WINDOW, 0)
                total = min(total, SORT_WINDOW)
                rows.sort(key=_sort_key(sort), reverse=desc)
                rows = rows[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
        except ApiError as exc:
            return _api_failure(request, exc)
    return _render(request, "programs.html", title="Programs", rows=rows, statuses=STATUSES,
                   status_filter=status, session=session, sort=sort, desc=desc,
                   sorts=PROGRAM_SORTS, **_page_links(total, page))


@get("/sessions", name="ui.sessions")
async def sessions_page(request: Req) -> Response[Any]:
    token = _token(request)
    if token is None:
        return _login_redirect(request)
    q = request.query_params
    sort = str(q.get("sort") or "created_at")
    sort = sort if sort in SESSION_SORTS else "created_at"
    desc = q.get("dir", "desc") != "asc"
    page = _int(q.get("page"), 1)
    async with Api(_api_base(request), token) as api:
        try:
            if sort == "created_at" and desc:
                rows, total = await api.sessions(PAGE_SIZE, (page - 1) * PAGE_SIZE)
            else:
                rows, total = await api.sessions(SORT_WINDOW, 0)
                total = min(total, SORT_WINDOW)
                rows.sort(key=_sort_key(sort), reverse=desc)
                rows = rows[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
        except ApiError as exc:
            return _api_failure(request, exc)
    return _render(request, "sessions.html", title="Sessions", rows=rows, sort=sort,
                   desc=desc, sorts=SESSION_SORTS, **_page_links(total, page))


@get("/session", name="ui.session")
async def session_page(request: Req) -> Response[Any]:
    """One session: its programs with actions, and its trace as a timeline.

    The id travels in the query (?id=) so any id, even one with '/', has a page.
    """
    token = _token(request)
    if token is None:
        return _login_redirect(request)
    session_id = str(request.query_params.get("id") or "")
    async with Api(_api_base(request), token) as api:
        try:
            session = await api.session(session_id)
            trace = await api.trace(session_id)
            workers = [worker_row(w) for w in await api.workers()]
        except ApiError as exc:
            return _api_failure(request, exc)
    live = any(p.get("status") not in ("STOPPED", "FAILED") for p in session["programs"])
    timeline = layout(trace, now=time.time() if live else None)
    return _render(request, "session.html", title=f"Session {session_id}", session=session,
                   timeline=timeline, events=trace[-200:], workers=workers,
                   here=f"/ui/session?id={_quote_all(session_id)}")


def _quote_all(value: str) -> str:
    return quote(value, safe="")


@post("/actions/program", status_code=303)
async def program_action(request: Req) -> Response[Any]:
    return await _action(request, "program")


@post("/actions/session", status_code=303)
async def session_action(request: Req) -> Response[Any]:
    return await _action(request, "session")


async def _action(request: Req, target: str) -> Response[Any]:
    form = await request.form()
    if not _csrf_ok(request, form):
        return _render(request, "error.html", status=403, title="Error", message=
                       "missing or wrong CSRF token: the action was not done")
    token = _token(request)
    if token is None:
        return Redirect("/ui/login", status_code=303)
    nxt = _safe_next(form.get("next"))
    action = str(form.get("action") or "")
    object_id = str(form.get("id") or "")
    worker_id = str(form.get("worker_id") or "")
    if target == "session":
        action = "migrate"
    if action not in PROGRAM_ACTIONS or not object_id or (action == "migrate"
                                                          and not worker_id):
        return _render(request, "error.html", status=400, title="Error",
                       message="incomplete action form")
    kind = "programs" if target == "program" else "sessions"
    path = f"/v1/{kind}/{_quote_all(object_id)}/{action}"
    body = ({"worker_id": worker_id, "now": form.get("now") == "1"}
            if action == "migrate" else None)
    async with Api(_api_base(request), token) as api:
        try:
            await api.post(path, body)
        except ApiError as exc:
            if exc.status == 401:
                return _api_failure(request, exc)
            _flash(request, "error", f"{action} {target} {object_id} failed: {exc.message}")
            return Redirect(nxt, status_code=303)
    done = f" to {worker_id}" if action == "migrate" else ""
    _flash(request, "ok", f"{action} {target} {object_id}{done}: done")
    return Redirect(nxt, status_code=303)


def loopback_base(url: str) -> str:
    """The daemon's own URL as the UI should call it: a wildcard bind is reached on loopback."""
    parts = urlsplit(url.rstrip("/"))
    host = parts.hostname or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1" if host != "::" else "[::1]"
    elif ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme or 'http'}://{host}{port}"


def create_ui_router(api_base_url: str, *, session_max_age_s: int = 8 * 3600,
                     secure_cookie: bool = False) -> Router:
    """The /ui router; `api_base_url` is where the daemon's REST API answers (itself)."""
    session = ServerSideSessionConfig(
        key="agentd_ui", path="/ui", httponly=True, samesite="strict",
        secure=secure_cookie, max_age=session_max_age_s, store="agentd_ui_sessions")
    static = create_static_files_router(path="/static", directories=[HERE / "static"],
                                        opt={"scope": PUBLIC_SCOPE})
    return Router(
        path="/ui",
        route_handlers=[login_page, login, logout, overview, events, programs_page,
                        sessions_page, session_page, program_action, session_action, static],
        middleware=[session.middleware],
        opt={"scope": PUBLIC_SCOPE, "ui_api_base": loopback_base(api_base_url)},
        include_in_schema=False,
        response_headers=[
            ResponseHeader(name="Content-Security-Policy", value=CSP),
            ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
            ResponseHeader(name="Referrer-Policy", value="same-origin"),
            ResponseHeader(name="Cache-Control", value="no-store"),
        ],
    )
