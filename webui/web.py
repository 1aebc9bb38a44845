"""What every UI handler shares: templates, the login session, CSRF, flashes, API access.

The API token lives only in the server-side session; the browser holds an opaque,
HttpOnly, SameSite=Strict session id. Pages call the daemon's REST API with that token
(`with_api`); forms that change anything go through `form_action`, which refuses a
missing or wrong CSRF token before doing anything else.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import jinja2
from litestar import MediaType, Request, Response
from litestar.response import Redirect

from console.render import nbytes
from webui.client import Api, ApiError

Req = Request[Any, Any, Any]
Form = Any  # litestar's FormMultiDict
# The API's scope that includes every other (daemon/access/auth.py; the UI may not
# import the daemon).
OPERATOR = "operator"
PageWork = Callable[[Api], Awaitable[Response[Any]]]
# An action returns the flash text and where to go next (None: the form's `next`).
ActionWork = Callable[[Api, Form], Awaitable[tuple[str, str | None]]]
Describe = Callable[[Form], str]  # "migrate program p1": names the action in a failure

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("webui", "templates"),
    autoescape=True,  # every template, every variable: ids and names are user-controlled
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


def human_bytes(n: Any) -> str:
    return nbytes(n, missing="?")


def qall(value: Any) -> str:
    """A value for a query string or path segment: everything but unreserved is encoded."""
    return quote(str(value), safe="")


_env.filters["ago"] = _ago
_env.filters["bytes"] = human_bytes
_env.filters["q"] = qall
_env.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=repr)


# --- session and CSRF --------------------------------------------------------------------


def api_base(request: Req) -> str:
    return str(request.route_handler.opt["ui_api_base"])


def token_of(request: Req) -> str | None:
    token = request.session.get("token") if request.session else None
    return token if isinstance(token, str) else None


def csrf_token(request: Req) -> str:
    session = request.session
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
    return token


def csrf_ok(request: Req, form: Form) -> bool:
    sent = form.get("_csrf")
    held = request.session.get("csrf") if request.session else None
    return (isinstance(sent, str) and isinstance(held, str)
            and hmac.compare_digest(sent.encode(), held.encode()))


def flash(request: Req, kind: str, text: str) -> None:
    request.session["flash"] = [kind, text]


def safe_next(value: Any, default: str = "/ui/") -> str:
    """Only redirect to our own pages (no scheme, no host, no '//' tricks)."""
    if (isinstance(value, str) and value.startswith("/ui") and "//" not in value
            and "\\" not in value and all(32 < ord(c) < 127 for c in value)):
        return value
    return default


# --- responses ---------------------------------------------------------------------------


def scopes_of(request: Req) -> frozenset[str]:
    """The logged-in token's scopes, as the daemon told the login (GET /v1/whoami)."""
    held = request.session.get("scopes") if request.session else None
    return frozenset(str(s) for s in held) if isinstance(held, list) else frozenset()


def may(scopes: frozenset[str], scope: str) -> bool:
    """Whether a page offers an action that needs `scope`: the API refuses it anyway,
    but a read-only user should not be shown buttons that can only fail."""
    return OPERATOR in scopes or scope in scopes


def render(request: Req, template: str, status: int = 200, **context: Any) -> Response[str]:
    flashed = request.session.pop("flash", None) if request.session else None
    scopes = scopes_of(request)
    html = _env.get_template(template).render(
        csrf=csrf_token(request), flash=flashed, logged_in=token_of(request) is not None,
        path=request.url.path, query=str(request.url.query or ""),
        may=lambda scope: may(scopes, scope), **context)
    return Response(html, status_code=status, media_type=MediaType.HTML)


def error_page(request: Req, status: int, message: str) -> Response[str]:
    return render(request, "error.html", status=status, title="Error", code=status,
                  message=message)


def login_redirect(request: Req) -> Redirect:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return Redirect(f"/ui/login?next={quote(here, safe='/')}", status_code=303)


def api_failure(request: Req, exc: ApiError) -> Response[Any]:
    if exc.status == 401:  # token revoked or expired: log out
        request.clear_session()
        return login_redirect(request)
    return error_page(request, exc.status if exc.status >= 400 else 502, exc.message)


async def with_api(request: Req, work: PageWork) -> Response[Any]:
    """Run a page's API calls as the logged-in user; any API refusal becomes a page."""
    token = token_of(request)
    if token is None:
        return login_redirect(request)
    async with Api(api_base(request), token) as api:
        try:
            return await work(api)
        except ApiError as exc:
            return api_failure(request, exc)


async def form_action(request: Req, work: ActionWork, describe: Describe) -> Response[Any]:
    """A state-changing form: CSRF first, then the API call, then a flash and a redirect.

    An API refusal is shown as a flash on the page the form came from, not as a crash.
    """
    form = await request.form()
    if not csrf_ok(request, form):
        return error_page(request, 403, "missing or wrong CSRF token: nothing was changed")
    token = token_of(request)
    if token is None:
        return Redirect("/ui/login", status_code=303)
    back = safe_next(form.get("next"))
    async with Api(api_base(request), token) as api:
        try:
            text, goto = await work(api, form)
        except (ApiError, FormError) as exc:
            if isinstance(exc, ApiError) and exc.status == 401:
                return api_failure(request, exc)
            why = exc.message if isinstance(exc, ApiError) else str(exc)
            flash(request, "error", f"{describe(form)} failed: {why}")
            _keep_input(request, form)
            return Redirect(back, status_code=303)
    flash(request, "ok", text)
    return Redirect(safe_next(goto, back) if goto else back, status_code=303)


def _keep_input(request: Req, form: Form) -> None:
    """A refused form comes back filled in (an edited policy source is not lost)."""
    form_id = form.get("form_id")
    if isinstance(form_id, str):
        values = {k: v for k, v in form.items() if k != "_csrf" and isinstance(v, str)}
        request.session["refill"] = [form_id, values]


def refill(request: Req, form_id: str) -> dict[str, str]:
    """The values a refused `form_id` form was sent with, once; empty otherwise."""
    held = request.session.get("refill") if request.session else None
    if isinstance(held, list) and len(held) == 2 and held[0] == form_id:
        request.session.pop("refill", None)
        return dict(held[1])
    return {}


class FormError(Exception):
    """A form field the UI itself refuses before calling the API; names the field."""


def int_param(value: Any, default: int, low: int = 1) -> int:
    try:
        return max(low, int(value))
    except (TypeError, ValueError):
        return default
