"""Workflows and runs over REST, plus the runtime protocol the sandboxes call back on.

Clients:   POST/GET /v1/workflows · POST /v1/runs · GET /v1/runs · GET /v1/runs/{id}
           GET /v1/runs/{id}/events (SSE) · DELETE /v1/runs/{id}
Sandboxes: POST /v1/runs/{id}/events · GET /v1/runs/{id}/state · PUT /v1/runs/{id}/state/{name}
           POST /v1/runs/{id}/control (its view in, the global controller's decisions out)
           (scope submit, and the token must be that run's own token, or an operator's)
Control:   GET /v1/control · GET /v1/runs/{id}/control
           PUT /v1/control/policy (operator: the same activation as
           POST /v1/policies/{name}/activate, for the control layer's policies only)
           POST /v1/runs/{id}/control/decisions (operator: route / set_priority / migrate /
           kill / provision for one run, in the run's own names)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, delete, get, post, put
from litestar.response import Stream

from daemon.access.auth import OPERATOR, READ, SUBMIT, principal_of
from daemon.api.errors import decode_body
from daemon.api.ids import id_problem
from daemon.api.policies_api import MAX_VERSION
from daemon.api.policies_api import service as policy_service
from daemon.api.tenants import access_of, check_session, request_tenant, session_owners
from daemon.errors import ApiError
from daemon.policies.registry import PolicyService
from daemon.runtime import bundle_tools, run_records
from daemon.runtime.bundles import BundleError
from daemon.runtime.global_controller import ControlLoop, ControlReport
from daemon.runtime.runs import MAX_EVENTS, Run, RunController
from daemon.toolsvc.service import ToolService
from tools import ToolError, ToolSpec

STATE_KEY = "agentd.runs"
CONTROL_KEY = "agentd.instances"
MAX_EVENTS_PER_POST = 1000


class WorkflowBody(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    files: dict[str, str]
    entry: str
    # Tool specs by name, as `[tools.NAME]` in config: see daemon/runtime/bundle_tools.py.
    tools: dict[str, Any] | None = None


class RunBody(msgspec.Struct, forbid_unknown_fields=True):
    workflow: str
    args: dict[str, Any] = {}
    version: int | None = None
    session_id: str | None = None
    limits: dict[str, Any] | None = None
    # Tools (the bundle's or configured, by name) the run's program declares up front.
    tools: list[str] | None = None


class EventsBody(msgspec.Struct):
    events: list[dict[str, Any]]


class StateBody(msgspec.Struct, forbid_unknown_fields=True):
    value: Any


class DecisionsBody(msgspec.Struct, forbid_unknown_fields=True):
    decisions: list[dict[str, Any]]


class PolicyBody(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    version: Annotated[int, msgspec.Meta(ge=1, le=MAX_VERSION)] | None = None


def runs_of(request: Request[Any, Any, Any]) -> RunController:
    runs: RunController | None = request.app.state.get(STATE_KEY)
    if runs is None:
        raise ApiError(503, "the workflow runtime has not started", "unavailable")
    return runs


def control_of(request: Request[Any, Any, Any]) -> ControlLoop:
    loop: ControlLoop | None = request.app.state.get(CONTROL_KEY)
    if loop is None:
        raise ApiError(503, "the global controller has not started", "unavailable")
    return loop


async def _control_policies(svc: PolicyService) -> list[str]:
    return [p["name"] for p in await svc.list_policies() if p["layer"] == "control"]


_BUNDLE_STATUS = {bundle_tools.INSUFFICIENT_SCOPE: 403, bundle_tools.NAME_TAKEN: 409}


def _bundle_error(exc: BundleError) -> ApiError:
    return ApiError(_BUNDLE_STATUS.get(exc.code, 400), str(exc), exc.code, exc.param)


def _is_operator(request: Request[Any, Any, Any]) -> bool:
    principal = principal_of(request)
    return principal is None or OPERATOR in principal.scopes


def _run_tools(runs: RunController, tools: ToolService, body: RunBody, tenant: str
               ) -> tuple[int | None, dict[str, ToolSpec]]:
    """The version a run will use and its bundle's tool specs, with the run's declared
    names checked against them, before anything starts."""
    manifest = runs.bundles.of(tenant).manifest(body.workflow, body.version)
    if manifest is None:
        return body.version, {}  # runs.create answers the unknown workflow
    specs = bundle_tools.bundle_specs(manifest, tools.manager.configured_names)
    try:
        tools.check_declarations(body.tools or [], specs)
    except ToolError as exc:
        raise ApiError(400, exc.message, "unknown_tool", "tools") from exc
    return int(manifest["version"]), specs


def _run(runs: RunController, run_id: str) -> Run:
    run = runs.runs.get(run_id)
    if run is None:
        raise ApiError(404, f"unknown run '{run_id}'", "not_found")
    return run


async def _recorded(runs: RunController, run_id: str) -> dict[str, Any]:
    """An ended run that has left memory, from its record."""
    view = await run_records.recorded(runs.records, run_id)
    if view is None:
        raise ApiError(404, f"unknown run '{run_id}'", "not_found")
    return view


async def _replay(events: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for event in events:
        yield event


def _own_run(request: Request[Any, Any, Any], runs: RunController, run_id: str) -> Run:
    run = _run(runs, run_id)
    principal = principal_of(request)
    if runs.auth_enabled and principal is not None and OPERATOR not in principal.scopes \
            and principal.token_id != run.token_id:
        raise ApiError(403, f"only run {run_id}'s own token may call its runtime endpoints",
                       "not_run_token")
    if run.ended:
        raise ApiError(409, f"run '{run_id}' has ended ({run.status})", "run_ended")
    return run


def _refuse_run_token(request: Request[Any, Any, Any], runs: RunController, what: str,
                      own_run: str | None = None) -> None:
    """A run's token has scope `submit` so its sandbox can reach the gateway and its own
    runtime endpoints; it must not act on other runs or start new ones."""
    principal = principal_of(request)
    if principal is None:
        return
    owner = runs.run_of_token(principal.token_id)
    if owner is not None and owner.id != own_run:
        raise ApiError(403, f"run {owner.id}'s token may not {what}", "run_token")


class WorkflowsController(Controller):
    path = "/v1"
    tags = ["workflows"]

    @post("/workflows", status_code=201, opt={"scope": SUBMIT},
          summary="Register a new version of a workflow bundle")
    async def register(self, request: Request[Any, Any, Any],
                       tools: ToolService) -> dict[str, Any]:
        _refuse_run_token(request, runs_of(request), "register workflows")
        body = decode_body(await request.body(), WorkflowBody)
        try:
            checked = bundle_tools.check_tools(
                body.tools, configured=tools.manager.configured_names,
                operator=_is_operator(request))
            tenant = await request_tenant(request, runs_of(request).core, None)
            store = runs_of(request).bundles.of(tenant)
            return store.register(body.name, body.files, body.entry, checked) | {
                "tenant": tenant}
        except BundleError as exc:
            raise _bundle_error(exc) from exc

    @get("/workflows", opt={"scope": READ},
         summary="Registered workflows and their versions (the caller's tenant's)")
    async def list_workflows(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        return {"data": runs_of(request).bundles.workflows(access_of(request).tenant)}

    @post("/runs", status_code=201, opt={"scope": SUBMIT},
          summary="Start a run of a workflow in a sandbox")
    async def start(self, request: Request[Any, Any, Any], tools: ToolService) -> dict[str, Any]:
        _refuse_run_token(request, runs_of(request), "start runs")
        body = decode_body(await request.body(), RunBody)
        if body.session_id is not None and (problem := id_problem(body.session_id)):
            raise ApiError(400, f"session_id {problem}", param="session_id")
        try:
            json.dumps(body.args)
        except (TypeError, ValueError) as exc:
            raise ApiError(400, f"args must be JSON: {exc}", param="args") from exc
        runs = runs_of(request)
        await check_session(runs.core, access_of(request), body.session_id)
        tenant = await request_tenant(request, runs.core, None)
        try:
            version, specs = _run_tools(runs, tools, body, tenant)
            run = await runs.create(tenant, body.workflow, version, body.args,
                                    body.session_id, body.limits,
                                    operator=_is_operator(request))
        except BundleError as exc:
            raise _bundle_error(exc) from exc
        # Before the sandbox's first step: its task has not run yet.
        tools.bind_bundle(run.program_id, specs)
        if body.tools and run.program_id in runs.core.programs:
            tools.declare(runs.core.programs[run.program_id], body.tools)
        return run.view()

    @get("/runs", opt={"scope": READ}, summary="Runs, newest first")
    async def list_runs(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        controller = runs_of(request)
        views = [r.view() for r in controller.runs.values()]
        views += await run_records.newest(controller.records, set(controller.runs))
        own = access_of(request).tenant
        if own is not None:  # a run is its session's tenant's
            owners = await session_owners(controller.core, {v["session_id"] for v in views})
            views = [v for v in views if owners.get(v["session_id"]) == own]
        views.sort(key=lambda v: v["timings"]["created_at"], reverse=True)
        return {"data": views}

    @get("/runs/{run_id:str}", opt={"scope": READ}, summary="One run: status, result or error")
    async def get_run(self, request: Request[Any, Any, Any], run_id: str) -> dict[str, Any]:
        runs = runs_of(request)
        run = runs.runs.get(run_id)
        if run is not None:
            return run.view()
        return await _recorded(runs, run_id)

    @delete("/runs/{run_id:str}", status_code=200, opt={"scope": SUBMIT},
            summary="Cancel a run: kill its sandbox and release its program")
    async def cancel(self, request: Request[Any, Any, Any], run_id: str) -> dict[str, Any]:
        runs = runs_of(request)
        _refuse_run_token(request, runs, "cancel other runs", own_run=run_id)
        if run_id not in runs.runs:
            return await _recorded(runs, run_id)  # ended long ago: nothing to cancel
        run = _run(runs, run_id)
        await runs.cancel(run)
        return run.view()

    @get("/runs/{run_id:str}/events", opt={"scope": READ},
         summary="The run's trace events as server-sent events, until it ends")
    async def events(self, request: Request[Any, Any, Any], run_id: str) -> Stream:
        runs = runs_of(request)
        run = runs.runs.get(run_id)
        events: AsyncIterator[dict[str, Any]]
        if run is not None:
            events = runs.follow(run)
        else:  # ended and let go: replayed from the trace
            view = await _recorded(runs, run_id)
            events = _replay(await run_records.stored_events(runs.core.sessions, view,
                                                             MAX_EVENTS))

        async def lines() -> AsyncIterator[bytes]:
            async for event in events:
                yield f"data: {json.dumps(event, default=repr)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return Stream(lines(), media_type="text/event-stream",
                      headers={"Cache-Control": "no-cache"})

    # --- the runtime protocol (sandbox -> daemon) -----------------------------------

    @post("/runs/{run_id:str}/events", status_code=200, opt={"scope": SUBMIT},
          summary="Sandbox: report future events of this run")
    async def post_events(self, request: Request[Any, Any, Any], run_id: str) -> dict[str, Any]:
        runs = runs_of(request)
        run = _own_run(request, runs, run_id)
        body = decode_body(await request.body(), EventsBody)
        if len(body.events) > MAX_EVENTS_PER_POST:
            raise ApiError(400, f"at most {MAX_EVENTS_PER_POST} events per call", param="events")
        return {"accepted": runs.sandbox_events(run, body.events)}

    @get("/runs/{run_id:str}/state", opt={"scope": SUBMIT},
         summary="Sandbox: the session's managed state")
    async def get_state(self, request: Request[Any, Any, Any], run_id: str) -> dict[str, Any]:
        runs = runs_of(request)
        run = _own_run(request, runs, run_id)
        return {"session_id": run.session_id, "state": await runs.load_state(run)}

    @put("/runs/{run_id:str}/state/{name:str}", status_code=200, opt={"scope": SUBMIT},
         summary="Sandbox: store one managed-state object of the session")
    async def put_state(self, request: Request[Any, Any, Any], run_id: str,
                        name: str) -> dict[str, Any]:
        runs = runs_of(request)
        run = _own_run(request, runs, run_id)
        body = decode_body(await request.body(), StateBody)
        if not 0 < len(name) <= 128:
            raise ApiError(400, "state name must be 1-128 characters", param="name")
        await runs.save_state(run, name, body.value)
        return {"session_id": run.session_id, "name": name}

    @post("/runs/{run_id:str}/control", status_code=200, opt={"scope": SUBMIT},
          summary="Sandbox: report its local controllers' view; get the decisions for it")
    async def report_control(self, request: Request[Any, Any, Any],
                             run_id: str) -> dict[str, Any]:
        runs = runs_of(request)
        run = _own_run(request, runs, run_id)
        body = decode_body(await request.body(), ControlReport)
        try:
            decisions = control_of(request).report(run, body.view)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="view") from exc
        return {"decisions": decisions}

    @get("/runs/{run_id:str}/control", opt={"scope": READ},
         summary="A run's agent instances, live calls and installed rules, as last reported")
    async def run_control(self, request: Request[Any, Any, Any], run_id: str) -> dict[str, Any]:
        run = _run(runs_of(request), run_id)
        view = control_of(request).run_view(run)
        if view is None:
            return {"run_id": run.id, "reported": False}
        return {"run_id": run.id, "reported": True,
                "instances": [i._asdict() | {"state": i.state.value} for i in view.instances],
                "futures": [f._asdict() | {"status": f.status.value} for f in view.futures],
                "priorities": dict(view.rules.priorities),
                "routes": [[s, t, i] for (s, t), i in view.rules.routes.items()]}

    @post("/runs/{run_id:str}/control/decisions", status_code=200, opt={"scope": OPERATOR},
          summary="Operator: queue route / set_priority / migrate / kill / provision for a run")
    async def run_decisions(self, request: Request[Any, Any, Any],
                            run_id: str) -> dict[str, Any]:
        run = _run(runs_of(request), run_id)
        if run.ended:
            raise ApiError(409, f"run '{run_id}' has ended ({run.status})", "run_ended")
        body = decode_body(await request.body(), DecisionsBody)
        try:
            results = control_of(request).submit(run, body.decisions)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="decisions") from exc
        except LookupError as exc:
            raise ApiError(409, str(exc), "no_view") from exc
        return {"results": results}

    @get("/control", opt={"scope": READ},
         summary="The global controller: active policy version and last step")
    async def control_status(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        loop = control_of(request)
        return loop.status() | {"policies": await _control_policies(policy_service(request))}

    @put("/control/policy", status_code=200, opt={"scope": OPERATOR},
         summary="Operator: validate and activate a control policy (default: its latest "
                 "version) from the next period, through the policy registry")
    async def control_policy(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        body = decode_body(await request.body(), PolicyBody)
        loop, svc = control_of(request), policy_service(request)
        known = await _control_policies(svc)
        if body.name not in known:
            raise ApiError(400, f"unknown control policy {body.name!r}; known: {known}",
                           param="name")
        previous = loop.guard.current
        principal = principal_of(request)
        out = await svc.activate(body.name, body.version,
                                 principal.name if principal is not None else "operator")
        return loop.status() | {"activated": out, "previous": {
            "name": previous.name, "version": previous.version}}
