"""Workflows and runs: the registered bundles, the runs (filter, page), submitting a run
from a form, one run's page with its events followed live, and cancelling a run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import Response, get, post
from litestar.response import ServerSentEvent, ServerSentEventMessage

from webui.client import Api, ApiError, seg
from webui.web import (
    Form,
    FormError,
    Req,
    api_base,
    form_action,
    int_param,
    qall,
    refill,
    render,
    token_of,
    with_api,
)

RUN_STATUSES = ("starting", "running", "finished", "failed", "cancelled")
ENDED = ("finished", "failed", "cancelled")
PAGE_SIZE = 25


def run_url(run_id: str) -> str:
    return f"/ui/run?id={qall(run_id)}"


@get("/workflows", name="ui.workflows")
async def workflows_page(request: Req) -> Response[Any]:
    q = request.query_params
    status = str(q.get("status") or "")
    status = status if status in RUN_STATUSES else ""
    page_no = int_param(q.get("page"), 1)

    async def page(api: Api) -> Response[Any]:
        workflows = await api.workflows()
        runs = [r for r in await api.runs() if not status or r["status"] == status]
        shown = runs[(page_no - 1) * PAGE_SIZE: page_no * PAGE_SIZE]
        return render(request, "workflows.html", title="Workflows", workflows=workflows,
                      runs=shown, statuses=RUN_STATUSES, status_filter=status,
                      page=page_no, pages=max(1, -(-len(runs) // PAGE_SIZE)), total=len(runs),
                      form=refill(request, "run-submit"))

    return await with_api(request, page)


@post("/actions/run", status_code=303)
async def submit_run(request: Req) -> Response[Any]:
    return await form_action(request, _submit, lambda f: f"start a run of {f.get('workflow')}")


def _json_field(form: Form, field: str) -> dict[str, Any] | None:
    raw = str(form.get(field) or "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise FormError(f"{field}: not valid JSON ({exc})") from exc
    except RecursionError as exc:  # the API would refuse it too (64 levels at most)
        raise FormError(f"{field}: nested too deeply") from exc
    if not isinstance(value, dict):
        raise FormError(f"{field}: must be a JSON object, like {{\"name\": 1}}")
    return value


async def _submit(api: Api, form: Form) -> tuple[str, str | None]:
    workflow = str(form.get("workflow") or "").strip()
    if not workflow:
        raise FormError("workflow: choose a workflow")
    body: dict[str, Any] = {"workflow": workflow, "args": _json_field(form, "args") or {}}
    limits = _json_field(form, "limits")
    if limits:
        body["limits"] = limits
    session = str(form.get("session_id") or "").strip()
    if session:
        body["session_id"] = session
    version = str(form.get("version") or "").strip()
    if version:
        if not version.isdigit():
            raise FormError("version: must be a whole number (or empty for the latest)")
        body["version"] = int(version)
    run = await api.post("/v1/runs", body)
    return f"started run {run['id']} of {workflow} v{run['version']}", run_url(run["id"])


@get("/run", name="ui.run")
async def run_page(request: Req) -> Response[Any]:
    run_id = str(request.query_params.get("id") or "")

    async def page(api: Api) -> Response[Any]:
        run = await api.run(run_id)
        events: list[dict[str, Any]] = []
        if run["status"] in ENDED:  # the stream of an ended run replays and closes
            events = [e async for e in api.sse(f"/v1/runs/{seg(run_id)}/events")]
        return render(request, "run.html", title=f"Run {run_id}", run=run, events=events,
                      ended=run["status"] in ENDED, here=run_url(run_id))

    return await with_api(request, page)


@get("/run/events", name="ui.run.events")
async def run_events(request: Req) -> Response[Any]:
    """The run's events as they happen (the API's stream, relayed), then its outcome."""
    run_id = str(request.query_params.get("id") or "")
    token = token_of(request)
    if token is None:
        return Response({"error": "log in first"}, status_code=401)
    base = api_base(request)

    async def stream() -> AsyncIterator[ServerSentEventMessage]:
        async with Api(base, token) as api:
            try:
                async for event in api.sse(f"/v1/runs/{seg(run_id)}/events"):
                    yield ServerSentEventMessage(data=json.dumps(event), event="run-event")
                run = await api.run(run_id)
            except ApiError as exc:
                yield ServerSentEventMessage(data=json.dumps(
                    {"status": exc.status, "message": exc.message}), event="failure")
                return
            outcome = {k: run.get(k) for k in ("status", "result", "error", "timings")}
            yield ServerSentEventMessage(data=json.dumps(outcome, default=repr), event="done")

    return ServerSentEvent(stream())


@post("/actions/run/cancel", status_code=303)
async def cancel_run(request: Req) -> Response[Any]:
    return await form_action(request, _cancel, lambda f: f"cancel run {f.get('id')}")


async def _cancel(api: Api, form: Form) -> tuple[str, str | None]:
    run_id = str(form.get("id") or "")
    if not run_id:
        raise FormError("id: missing")
    run = await api.delete(f"/v1/runs/{seg(run_id)}")
    return f"cancelled run {run_id} (now {run['status']})", run_url(run_id)
