"""Bulk release of idle programs from the web UI, behind a confirmation: the button asks
for a dry run (POST /v1/programs/release-idle with dry_run) and shows which programs it
would end; only the confirmation's form releases them. A tenant's token releases its own
tenant's programs only (the API decides); a read-only token is not shown the button."""

from __future__ import annotations

import math
from typing import Any

from litestar import Response, get, post

from webui.client import Api
from webui.web import Form, FormError, Req, error_page, form_action, render, with_api

DEFAULT_IDLE_S = 600.0  # as the TUI's key i (agentctl tui --idle-release)
SHOWN = 200  # the confirmation lists this many programs at most


def idle_of(value: Any) -> float:
    """The idle_s field, or FormError naming it."""
    if value in (None, ""):
        return DEFAULT_IDLE_S
    try:
        idle = float(str(value))
    except ValueError:
        raise FormError(f"idle_s must be seconds, got {value!r}") from None
    if not (math.isfinite(idle) and idle >= 0):
        raise FormError(f"idle_s must be >= 0 seconds, got {value!r}")
    return idle


@get("/release-idle", name="ui.release_idle")
async def confirm_page(request: Req) -> Response[Any]:
    """The confirmation: what a release would end now."""
    try:
        idle = idle_of(request.query_params.get("idle_s"))
    except FormError as exc:
        return error_page(request, 400, str(exc))

    async def page(api: Api) -> Response[Any]:
        listed = (await api.release_idle(idle, dry_run=True))["data"]
        return render(request, "release_idle.html", title="Release idle programs",
                      idle_s=idle, rows=listed[:SHOWN], total=len(listed))

    return await with_api(request, page)


@post("/actions/release-idle", status_code=303)
async def release(request: Req) -> Response[Any]:
    return await form_action(request, _release, lambda f: "release idle programs")


async def _release(api: Api, form: Form) -> tuple[str, str | None]:
    idle = idle_of(form.get("idle_s"))
    ended = (await api.release_idle(idle, dry_run=False))["data"]
    ids = ", ".join(p["id"] for p in ended[:10]) + (" …" if len(ended) > 10 else "")
    return (f"released {len(ended)} program(s) idle for at least {idle:g} s"
            + (f": {ids}" if ended else ""), "/ui/programs")
