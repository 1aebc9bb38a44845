"""The detail pages: one program, one request, one worker.

Each opens for its object in every state: while the daemon holds it (live figures, and
actions for the scopes that may use them) and after it has let go of it, or restarted,
when the API answers from the store. A field only a live object has is read with a
default, never assumed. Ids travel in the query (?id=), as for sessions and runs, so any
id has a page.
"""

from __future__ import annotations

import json
from typing import Any

from litestar import Response, get

from webui.client import Api
from webui.controllers import CONTENT_ROWS, runs_or_none
from webui.overview import engine_label, program_row, worker_row
from webui.web import Req, qall, render, with_api

TRACE_ROWS = 200  # a detail page lists this many of its object's newest trace events


def since(start: Any, end: Any) -> str:
    """`end - start` in milliseconds, or '' while either is missing."""
    if isinstance(start, int | float) and isinstance(end, int | float):
        return f"{(end - start) * 1000:.1f} ms"
    return ""


def request_row(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "queue": since(r.get("queued_at"), r.get("dispatched_at")),
            "ttft": since(r.get("queued_at"), r.get("first_token_at")),
            "e2e": since(r.get("queued_at"), r.get("finished_at"))}


async def _trace_of(api: Api, session_id: str, field: str, value: str) -> list[dict[str, Any]]:
    events = [e for e in await api.trace(session_id) if e.get(field) == value]
    return events[-TRACE_ROWS:]


@get("/program", name="ui.program")
async def program_page(request: Req) -> Response[Any]:
    """One program: its facts, its requests, its run, its trace; actions while live."""
    program_id = str(request.query_params.get("id") or "")

    async def page(api: Api) -> Response[Any]:
        body = await api.program(program_id)
        program = {**body, **program_row(body)}
        runs = [r for r in await runs_or_none(api) if r.get("program_id") == program_id]
        workers = [worker_row(w) for w in await api.workers()]
        contents = await api.get(f"/v1/sessions/{qall(program['session_id'])}/contents",
                                 limit=CONTENT_ROWS, program_id=program_id)
        return render(
            request, "program.html", title=f"Program {program_id}", program=program,
            contents=contents["data"], contents_total=contents["total"],
            live="held" in body,  # only the daemon's own copy carries `held`
            requests=[request_row(r) for r in body.get("requests") or []], runs=runs,
            workers=workers, events=await _trace_of(api, program["session_id"],
                                                    "program_id", program_id),
            here=f"/ui/program?id={qall(program_id)}")

    return await with_api(request, page)


@get("/request", name="ui.request")
async def request_page(request: Req) -> Response[Any]:
    """One LLM request: tokens, timings, outcome, the worker it ran on, its trace."""
    request_id = str(request.query_params.get("id") or "")

    async def page(api: Api) -> Response[Any]:
        req = request_row(await api.request(request_id))
        return render(request, "request.html", title=f"Request {request_id}", req=req,
                      events=await _trace_of(api, str(req["session_id"]), "request_id",
                                             request_id))

    return await with_api(request, page)


@get("/session/export", name="ui.session_export")
async def session_export(request: Req) -> Response[Any]:
    """A session's export (JSON, or a Perfetto trace file) as a download: a browser cannot
    send the API's bearer header, so the page links here."""
    session_id = str(request.query_params.get("id") or "")
    fmt = str(request.query_params.get("format") or "json")

    async def page(api: Api) -> Response[Any]:
        body = await api.get(f"/v1/sessions/{qall(session_id)}/export", format=fmt)
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in session_id)
        suffix = ".perfetto.json" if fmt == "perfetto" else ".json"
        return Response(json.dumps(body), media_type="application/json", headers={
            "Content-Disposition": f'attachment; filename="{name}{suffix}"'})

    return await with_api(request, page)


@get("/worker", name="ui.worker")
async def worker_page(request: Req) -> Response[Any]:
    """One engine worker: live stats while registered, what the store remembers after;
    the newest requests it ran."""
    worker_id = str(request.query_params.get("id") or "")

    async def page(api: Api) -> Response[Any]:
        body = await api.worker(worker_id)
        worker = {**body, **worker_row(body), "engine": engine_label(body.get("engine"))
                  if body.get("engine") else "unknown"}
        return render(request, "worker.html", title=f"Worker {worker_id}", worker=worker,
                      live=bool(body.get("live")),
                      requests=[request_row(r) for r in body.get("requests") or []],
                      requests_total=body.get("requests_total", 0))

    return await with_api(request, page)
