"""The /ui router: every page and action of the dashboard, its session and its headers.

The daemon's scope guard sees these routes as public ("public" scope): the UI enforces
its own login, and the API enforces the user's token scopes on every call the UI makes.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from litestar import Router
from litestar.datastructures import ResponseHeader
from litestar.middleware.session.server_side import ServerSideSessionConfig
from litestar.static_files import create_static_files_router

from webui import (
    api_docs,
    controllers,
    drilldown,
    policies,
    release_idle,
    tools_page,
    workflows,
)
from webui.overview import ChartCache

HERE = Path(__file__).parent
PUBLIC_SCOPE = "public"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
HANDLERS = [
    controllers.login_page, controllers.login, controllers.logout, controllers.overview,
    controllers.events, controllers.programs_page, controllers.programs_live,
    controllers.sessions_page, controllers.session_page, controllers.program_action,
    controllers.session_action,
    drilldown.program_page, drilldown.request_page, drilldown.worker_page,
    drilldown.session_export,
    policies.policies_page, policies.policy_page, policies.policy_diff_page,
    policies.policy_action,
    tools_page.tools_page, tools_page.reclaim,
    workflows.workflows_page, workflows.submit_run, workflows.run_page, workflows.run_events,
    workflows.cancel_run,
    api_docs.api_page, api_docs.api_document,
    release_idle.confirm_page, release_idle.release,
]


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
        route_handlers=[*HANDLERS, static],
        middleware=[session.middleware],
        # One read of the stored history per range and few seconds, shared by every viewer.
        opt={"scope": PUBLIC_SCOPE, "ui_api_base": loopback_base(api_base_url),
             "ui_history": ChartCache()},
        include_in_schema=False,
        response_headers=[
            ResponseHeader(name="Content-Security-Policy", value=CSP),
            ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
            ResponseHeader(name="Referrer-Policy", value="same-origin"),
            ResponseHeader(name="Cache-Control", value="no-store"),
        ],
    )
