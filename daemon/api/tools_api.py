"""Tool environments over REST: exec in a program's tool, declare, a program's tools and
their KV timing, list, gc."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.response import ServerSentEvent

from daemon.access.auth import OPERATOR, READ, SUBMIT, principal_of
from daemon.api.errors import decode_body, error_body
from daemon.api.exec_stream import exec_events
from daemon.api.ids import id_problem
from daemon.api.tenants import access_of, check_program, program_owners, request_tenant
from daemon.core.core import Core
from daemon.core.operations import live_program
from daemon.core.tenants import open_program
from daemon.errors import ApiError
from daemon.toolsvc.service import ToolService
from tools import ToolError
from tools.base import ExecResult, OutputListener

MAX_EXEC_TIMEOUT_S = 3600.0


class ExecBody(msgspec.Struct, forbid_unknown_fields=True):
    command: str | list[str]
    timeout_s: float | None = None
    # Answer with server-sent events: the output as it arrives, then the result
    # (daemon/api/exec_stream.py).
    stream: bool = False
    # Overrides of the declared or configured spec; for a tool neither knows, the spec.
    spec: dict[str, Any] | None = None


class GcBody(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = True


class DeclareBody(msgspec.Struct, forbid_unknown_fields=True):
    tools: list[str | dict[str, Any]]


def _require_operator_for_specs(request: Request[Any, Any, Any], field: str) -> None:
    """A spec picks the backend, image and mounts: with `process` it is a host command as
    the daemon's user. Clients with `submit` use the tools the operator configured."""
    principal = principal_of(request)
    if principal is not None and OPERATOR not in principal.scopes:
        raise ApiError(403, f"{field}: tool specs in a request need scope operator; "
                       "use a configured tool by name", "insufficient_scope", param=field)


def _status(err: ToolError) -> int:
    return {"unknown_tool": 404, "bad_spec": 400, "bad_path": 400, "released": 409,
            "unknown_image": 422, "engine_down": 503}.get(str(err.reason), 502)


def _tool_error(exc: ToolError, param: str | None = None) -> Response[Any]:
    return Response(_tool_error_body(exc, param), status_code=_status(exc))


def _tool_error_body(exc: ToolError, param: str | None = None) -> dict[str, Any]:
    # ApiError's shape has no room for what a tool failure carries (reason, exit code,
    # stderr tail), and a caller deciding whether to retry needs exactly that.
    body = error_body(_status(exc), str(exc), str(exc.reason), param)
    body["error"]["tool_error"] = exc.to_dict()
    return body


def _by_program(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"resources": 0, "disk_bytes": 0})
    for row in rows:
        if row["resource"] != "error":
            out[row["program_id"]]["resources"] += 1
            out[row["program_id"]]["disk_bytes"] += row["disk_bytes"] or 0
    return dict(out)


class ToolsController(Controller):
    path = "/v1"
    tags = ["tools"]

    @post("/programs/{program_id:str}/tools/{tool:str}/exec", status_code=200,
          opt={"scope": SUBMIT}, summary="Run a command in the program's tool environment")
    async def exec(self, core: Core, tools: ToolService, request: Request[Any, Any, Any],
                   program_id: str, tool: str) -> Response[Any]:
        body = decode_body(await request.body(), ExecBody)
        if body.timeout_s is not None and not 0 < body.timeout_s <= MAX_EXEC_TIMEOUT_S:
            raise ApiError(400, f"timeout_s must be in (0, {MAX_EXEC_TIMEOUT_S:.0f}]",
                           param="timeout_s")
        if not body.command:
            raise ApiError(400, "command must not be empty", param="command")
        if body.spec:
            _require_operator_for_specs(request, "spec")
        await live_program(core, program_id)
        try:
            spec = tools.resolve(program_id, tool, body.spec)
        except ToolError as exc:
            return _tool_error(exc, "spec")
        timeout = body.timeout_s or (spec.exec_timeout_s if spec else None)
        if body.stream:
            def run(on_output: OutputListener) -> Awaitable[ExecResult]:
                return tools.manager.exec(program_id, tool, body.command, timeout_s=timeout,
                                          spec=spec, on_output=on_output)

            def failed(exc: ToolError) -> dict[str, Any]:
                return {**_tool_error_body(exc), "status": _status(exc)}

            return ServerSentEvent(exec_events(run, failed))
        try:
            result = await tools.manager.exec(program_id, tool, body.command,
                                              timeout_s=timeout, spec=spec)
        except ToolError as exc:
            return _tool_error(exc)
        return Response(result.to_dict(), status_code=200)

    @post("/programs/{program_id:str}/tools", status_code=200, opt={"scope": SUBMIT},
          summary="Declare the tools a program will use: prepared while it waits")
    async def declare(self, core: Core, tools: ToolService, request: Request[Any, Any, Any],
                      program_id: str) -> Response[Any]:
        body = decode_body(await request.body(), DeclareBody)
        if (problem := id_problem(program_id)) is not None:
            raise ApiError(400, f"program_id {problem}", param="program_id")
        if any(not isinstance(item, str) for item in body.tools):
            _require_operator_for_specs(request, "tools")
        program = await open_program(core, program_id, None,
                                     await request_tenant(request, core, None))
        try:
            names = tools.declare(program, body.tools)
        except ToolError as exc:
            return _tool_error(exc, "tools")
        return Response({"program_id": program.id, "tools": names}, status_code=200)

    @get("/programs/{program_id:str}/tools", opt={"scope": READ},
         summary="A program's declared and bundle tools, and its tool timing in the KV view")
    async def program_tools(self, core: Core, tools: ToolService,
                            program_id: str) -> dict[str, Any]:
        if program_id not in core.programs and await core.load_program(program_id) is None:
            raise ApiError(404, f"unknown program '{program_id}'", "not_found")
        return tools.program_tools(program_id)

    @get("/tools", opt={"scope": READ}, summary="Tool containers, volumes and directories")
    async def list_tools(self, core: Core, tools: ToolService, request: Request[Any, Any, Any],
                         program_id: str | None = None) -> dict[str, Any]:
        access = access_of(request)
        await check_program(core, access, program_id)
        rows = await tools.manager.list(program_id, sizes=True)
        if access.tenant is not None:  # a backend's error row concerns no program
            owners = await program_owners(core, {r["program_id"] for r in rows
                                                 if r["resource"] != "error"})
            rows = [r for r in rows if r["resource"] == "error"
                    or owners.get(r["program_id"]) == access.tenant]
        return {"data": rows, "by_program": _by_program(rows)}

    @post("/tools/gc", status_code=200, opt={"scope": OPERATOR},
          summary="Reclaim tool resources of ended programs (dry_run lists them)")
    async def gc(self, tools: ToolService, request: Request[Any, Any, Any]) -> dict[str, Any]:
        body = decode_body(await request.body() or b"{}", GcBody)
        done = await tools.manager.reconcile(tools.live_programs, dry_run=body.dry_run)
        # Engines that did not answer were skipped, not failed: their leftovers go in a later
        # sweep or gc once they answer again.
        return {"dry_run": body.dry_run, "data": done, "hosts_down": tools.manager.hosts_down()}
