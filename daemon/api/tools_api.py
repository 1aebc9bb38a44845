"""Tool environments over REST: exec in a program's tool, list, garbage-collect."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get, post

from daemon.api.errors import ApiError, decode_body
from daemon.auth import OPERATOR, READ, SUBMIT
from daemon.core import Core
from daemon.operations import live_program
from daemon.tool_service import ToolService
from tools import SpecError, ToolError, merge_spec

MAX_EXEC_TIMEOUT_S = 3600.0


class ExecBody(msgspec.Struct, forbid_unknown_fields=True):
    command: str | list[str]
    timeout_s: float | None = None
    spec: dict[str, Any] | None = None  # per-request overrides of the configured spec


class GcBody(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = True


class DeclareBody(msgspec.Struct, forbid_unknown_fields=True):
    tools: list[str]


def _status(err: ToolError) -> int:
    return {"unknown_tool": 404, "bad_spec": 400, "bad_path": 400, "released": 409,
            "unknown_image": 422, "engine_down": 503}.get(str(err.reason), 502)


class ToolsController(Controller):
    path = "/v1"
    tags = ["tools"]

    @post("/programs/{program_id:str}/tools/{tool:str}/exec", status_code=200,
          opt={"scope": SUBMIT}, summary="Run a command in the program's tool environment")
    async def exec(self, core: Core, tools: ToolService, request: Request[Any, Any, Any],
                   program_id: str, tool: str) -> dict[str, Any]:
        body = decode_body(await request.body(), ExecBody)
        if body.timeout_s is not None and not 0 < body.timeout_s <= MAX_EXEC_TIMEOUT_S:
            raise ApiError(400, f"timeout_s must be in (0, {MAX_EXEC_TIMEOUT_S:.0f}]",
                           param="timeout_s")
        if not body.command:
            raise ApiError(400, "command must not be empty", param="command")
        await live_program(core, program_id)
        try:
            spec = tools.manager.spec_for(tool)
            if body.spec:
                spec = merge_spec(spec, body.spec)
            result = await tools.manager.exec(program_id, tool, body.command,
                                              timeout_s=body.timeout_s, spec=spec)
        except SpecError as exc:
            raise ApiError(400, f"invalid spec: {exc}", "bad_spec", param="spec") from exc
        except ToolError as exc:
            raise ApiError(_status(exc), str(exc), str(exc.reason)) from exc
        return result.to_dict()

    @post("/programs/{program_id:str}/tools", status_code=200, opt={"scope": SUBMIT},
          summary="Declare the tools a program will use: prepared while it waits")
    async def declare(self, core: Core, tools: ToolService, request: Request[Any, Any, Any],
                      program_id: str) -> dict[str, Any]:
        body = decode_body(await request.body(), DeclareBody)
        program = await core.ensure_program(program_id, None)
        try:
            tools.declare(program, body.tools)
        except ToolError as exc:
            raise ApiError(_status(exc), str(exc), str(exc.reason), param="tools") from exc
        return {"program_id": program.id, "tools": tools.declared[program.id]}

    @get("/tools", opt={"scope": READ}, summary="Tool containers, volumes and directories")
    async def list_tools(self, tools: ToolService) -> dict[str, Any]:
        return {"data": await tools.manager.list(sizes=True)}

    @post("/tools/gc", status_code=200, opt={"scope": OPERATOR},
          summary="Reclaim tool resources of ended programs (dry_run lists them)")
    async def gc(self, tools: ToolService, request: Request[Any, Any, Any]) -> dict[str, Any]:
        body = decode_body(await request.body() or b"{}", GcBody)
        done = await tools.manager.reconcile(tools.live_programs, dry_run=body.dry_run)
        return {"dry_run": body.dry_run, "data": done}
