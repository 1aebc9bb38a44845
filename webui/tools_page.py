"""Tools: the containers, volumes and directories programs hold, their owners and disk,
and reclaiming what belongs to no live program (GET /v1/tools, POST /v1/tools/gc)."""

from __future__ import annotations

from typing import Any

from litestar import Response, get, post

from webui.client import Api, ApiError
from webui.web import Form, Req, form_action, human_bytes, render, with_api


@get("/tools", name="ui.tools")
async def tools_page(request: Req) -> Response[Any]:
    want_preview = request.query_params.get("preview") == "1"

    async def page(api: Api) -> Response[Any]:
        rows = await api.tools()
        resources = [r for r in rows if r.get("resource") != "error"]
        problems = [r for r in rows if r.get("resource") == "error"]
        preview, preview_error = None, None
        if want_preview:  # a dry run changes nothing, so a plain link may ask for it
            try:
                preview = await api.tools_gc(dry_run=True)
            except ApiError as exc:
                if exc.status == 401:
                    raise
                preview_error = exc.message
        resources.sort(key=lambda r: (str(r.get("program_id")), str(r.get("tool"))))
        return render(request, "tools.html", title="Tools", resources=resources,
                      problems=problems, preview=preview, preview_error=preview_error,
                      disk=sum(r.get("disk_bytes") or 0 for r in resources),
                      owners=_owners(resources))

    return await with_api(request, page)


def _owners(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per owning program: how many resources it holds and their disk."""
    out: dict[str, dict[str, Any]] = {}
    for r in resources:
        row = out.setdefault(str(r.get("program_id")), {"program_id": r.get("program_id"),
                                                       "resources": 0, "disk_bytes": 0})
        row["resources"] += 1
        row["disk_bytes"] += r.get("disk_bytes") or 0
    return sorted(out.values(), key=lambda row: -row["disk_bytes"])


@post("/actions/tools/reclaim", status_code=303)
async def reclaim(request: Req) -> Response[Any]:
    return await form_action(request, _reclaim, lambda _: "reclaim tool resources")


async def _reclaim(api: Api, _form: Form) -> tuple[str, str | None]:
    done = await api.tools_gc(dry_run=False)
    ok = [d for d in done if d.get("ok")]
    failed = [d for d in done if not d.get("ok")]
    freed = human_bytes(sum(d.get("disk_bytes") or 0 for d in ok))
    what = "; ".join(f"{d.get('resource')} {d.get('name') or d.get('id')} of "
                     f"{d.get('program_id')}" for d in ok[:10])
    text = f"reclaimed {len(ok)} resource(s), {freed}" + (f": {what}" if what else "")
    if failed:
        text += f"; {len(failed)} could not be removed (retried by the next sweep)"
    return text, "/ui/tools"
