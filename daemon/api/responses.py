"""OpenAI's Responses API: `POST /v1/responses` (streaming too), `GET` and `DELETE
/v1/responses/{response_id}`.

A response runs through the same path as a chat completion (the gateway's sampling,
program and admission helpers, `core.submit`, chat_tools for function tools); its input
items become chat messages (daemon/api/response_items.py). With `store` (the default) the
response is kept in the store: `GET` answers it, and a later request continues its
conversation by `previous_response_id` (the instructions do not carry over, as at OpenAI).

Program identity needs no extension field: a chain of responses linked by
`previous_response_id` is one program. A response continues its previous one's program
while that is live and idle (two responses continuing one at once: the second gets a new
program in the same session), else a new program in the previous one's session. Such a
program ends when idle (daemon/core/lineage.py, `lineage_idle_s`). A first response is
matched by lineage inference like a chat request (a client that sends the whole history
with `store` off); `X-Program-Id` / `X-Session-Id` name a program as for chat.

Responses belong to the tenant that created them: another tenant's id answers 404, in a
path (daemon/api/tenants.py `require_owner`) and as `previous_response_id`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.response import Stream
from sqlalchemy import delete as sql_delete

from daemon.access.auth import READ, SUBMIT
from daemon.api import chat_tools, response_items
from daemon.api.gateway import (
    NOT_RECORDED,
    MaxTokens,
    Metadata,
    _Common,
    _finish_recorded,
    _program,
    _record_client,
    _release_quietly,
    _sampling,
    decode_request,
)
from daemon.api.limits import admit
from daemon.api.response_items import FunctionTool, NamedChoice, Output
from daemon.api.response_stream import Events
from daemon.api.tenants import access_of, check_response, request_tenant
from daemon.core.core import Core
from daemon.core.lineage import Asked, prefix_digests
from daemon.core.tenants import open_program
from daemon.errors import ApiError
from daemon.state import ProgramState, ProgramStatus, RequestState, StreamItem
from daemon.workers.protocol import ChatMessage, Finish, Tools
from db import models


class TextFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, forbid_unknown_fields=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: MaxTokens | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: Metadata | None = None
    user: str | None = None
    safety_identifier: str | None = None
    tenant: str | None = None  # operator tokens only, as for chat; or X-Tenant
    # Declared to be refused unless at their no-op value (_UNSUPPORTED).
    background: bool | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    service_tier: str | None = None
    prompt: dict[str, Any] | None = None
    conversation: Any = None
    prompt_cache_key: str | None = None
    stream_options: dict[str, Any] | None = None


_UNSUPPORTED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("background", lambda v: not v, "background responses are not supported"),
    ("include", lambda v: not v, "no extra output can be included"),
    ("reasoning", lambda v: v is None, "the served models take no reasoning options"),
    ("max_tool_calls", lambda v: v is None, "max_tool_calls is not supported"),
    ("top_logprobs", lambda v: not v, "logprobs are not returned by the Responses API here; "
     "use chat completions"),
    ("truncation", lambda v: v in (None, "disabled"), "only truncation 'disabled' is "
     "supported"),
    ("service_tier", lambda v: v in (None, "auto", "default"), "agentd has one service tier"),
    ("prompt", lambda v: v is None, "prompt templates are not supported"),
    ("conversation", lambda v: v is None, "conversations are not supported; chain responses "
     "with previous_response_id"),
    ("prompt_cache_key", lambda v: v is None, "agentd caches prefixes by program, not by key"),
    ("stream_options", lambda v: not v, "stream_options are not supported"),
)


class ResponsesController(Controller):
    path = "/v1"
    tags = ["openai"]

    @post("/responses", status_code=200, opt={"scope": SUBMIT},
          summary="OpenAI Responses API (streaming too); previous_response_id continues a "
                  "response's conversation and program")
    async def create(self, request: Request[Any, Any, Any], core: Core) -> Response[Any]:
        body = decode_request(await request.body(), ResponsesRequest)
        _refuse_unsupported(body)
        tools = chat_tools.engine_tools(
            response_items.functions(body.tools), *response_items.choice(body.tool_choice),
            body.parallel_tool_calls)
        tenant = await request_tenant(request, core, body.tenant)
        previous = await _previous(core, request, body.previous_response_id)
        conversation = [*_conversation_of(previous), *response_items.input_messages(body.input)]
        messages = _with_instructions(body.instructions, conversation)
        sampling = _sampling(core, _Common(model=body.model, temperature=_or(body.temperature),
                                           top_p=_or(body.top_p)), body.max_output_tokens)
        schema = _output_schema(body.text)
        if schema is not None:
            sampling = msgspec.structs.replace(sampling, json_schema=schema)
        chat_tools.check_support(core, body.model, tools, chat_tools.uses_tools(tools, messages))
        admit(request, core, chat_tools.prompt_chars(tools, messages), "input", tenant)
        program, named = await _chain_program(core, request, body, tenant, previous, messages)
        req = core.submit(program, "chat", body.model, sampling, messages=messages, tools=tools)
        _record_client(core, req, body.safety_identifier or body.user, body.metadata)
        answer = _Answer(core, req, body, tenant, program, conversation, named)
        headers = {"X-Program-Id": program.id, "X-Session-Id": program.session_id,
                   "X-Request-Id": req.id}
        if body.stream:
            return Stream(answer.events(), media_type="text/event-stream",
                          headers={**headers, "Cache-Control": "no-cache"})
        return Response(await answer.whole(), headers=headers)

    @get("/responses/{response_id:str}", opt={"scope": (READ, SUBMIT)},
         summary="A stored response")
    async def retrieve(self, core: Core, response_id: str) -> dict[str, Any]:
        async with core.sessions() as s:
            row = await s.get(models.Response, response_id)
        if row is None:
            raise _unknown(response_id, "response_id")
        return dict(row.body)

    @delete("/responses/{response_id:str}", status_code=200, opt={"scope": SUBMIT},
            summary="Delete a stored response (later ones that continue it are kept)")
    async def remove(self, core: Core, response_id: str) -> dict[str, Any]:
        async with core.sessions() as s, s.begin():
            gone = await s.execute(sql_delete(models.Response)
                                   .where(models.Response.id == response_id))
        if not gone.rowcount:
            raise _unknown(response_id, "response_id")
        return {"id": response_id, "object": "response", "deleted": True}


def _refuse_unsupported(body: ResponsesRequest) -> None:
    for name, is_no_op, why in _UNSUPPORTED:
        if not is_no_op(getattr(body, name)):
            raise ApiError(400, f"{name}: {why}", "unsupported_field", param=name)
    if body.text is not None and body.text.verbosity not in (None, "medium"):
        raise ApiError(400, "text.verbosity is not supported", "unsupported_field",
                       param="text.verbosity")


def _or(value: float | None) -> float:
    return 1.0 if value is None else value  # OpenAI's default temperature and top_p


def _unknown(response_id: str, param: str) -> ApiError:
    return ApiError(404, f"unknown response '{response_id}'", "not_found", param=param)


async def _previous(core: Core, request: Request[Any, Any, Any],
                    response_id: str | None) -> models.Response | None:
    if response_id is None:
        return None
    await check_response(core, access_of(request), response_id, "previous_response_id")
    async with core.sessions() as s:
        row: models.Response | None = await s.get(models.Response, response_id)
    if row is None:
        raise _unknown(response_id, "previous_response_id")
    return row


def _conversation_of(previous: models.Response | None) -> list[ChatMessage]:
    if previous is None:
        return []
    return msgspec.convert(previous.conversation, list[ChatMessage])


def _with_instructions(instructions: str | None, conversation: list[ChatMessage]
                       ) -> list[ChatMessage]:
    if not instructions:
        return conversation
    return [ChatMessage(role="system", content=instructions), *conversation]


def _output_schema(text: TextConfig | None) -> str | None:
    """The JSON text of the schema `text.format` asks the output to follow."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return '{"type": "object"}'
    if fmt.type != "json_schema" or not isinstance(fmt.schema, dict):
        raise ApiError(400, "text.format must be text, json_object, or json_schema with an "
                       "object `schema`", param="text.format")
    return msgspec.json.encode(fmt.schema).decode()


async def _chain_program(core: Core, request: Request[Any, Any, Any], body: ResponsesRequest,
                         tenant: str, previous: models.Response | None,
                         messages: list[ChatMessage]) -> tuple[ProgramState, bool]:
    """(program, named): the previous response's program while it is live and idle, else
    a new one in its session; for a first response, what a chat request would get. The
    daemon ends the program when idle (lineage holds it) unless the client named it
    (X-Program-Id, then or on the response this one continues): a named program is the
    client's to release."""
    if previous is None:
        program = await _program(core, request, _Common(model=body.model), tenant, messages)
        named = "x-program-id" in request.headers
    else:
        live = core.programs.get(previous.program_id)
        continues = live is not None and live.active_request is None \
            and live.status not in (ProgramStatus.STOPPED, ProgramStatus.FAILED)
        program = await open_program(core, previous.program_id if continues else None,
                                     None if continues else previous.session_id, tenant)
        named = continues and not core.lineage.holds(program.id)
    if not named and (body.store or core.lineage.inference):
        core.lineage.opened(program, Asked(tenant, prefix_digests(messages)[-1]))
    return program, named


class _Answer:
    """One response's reply, whole or streamed: its output, its record, its program."""

    def __init__(self, core: Core, req: RequestState, body: ResponsesRequest, tenant: str,
                 program: ProgramState, conversation: list[ChatMessage], named: bool) -> None:
        self.core, self.req, self.body, self.tenant = core, req, body, tenant
        self.program, self.conversation, self.named = program, conversation, named
        self.id = response_items.item_id("resp")
        self.output = Output()
        # Taken straight after submit, before any await (as the gateway's _respond).
        self.since = core.writer.mark()

    def response(self, status: str, output: list[dict[str, Any]],
                 finish: Finish | None = None, error: dict[str, str] | None = None
                 ) -> dict[str, Any]:
        body, tools = self.body, self.req.tools
        return {
            "id": self.id, "object": "response", "created_at": int(self.req.queued_at),
            "status": status, "error": error,
            "incomplete_details": ({"reason": "max_output_tokens"}
                                   if status == "incomplete" else None),
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "model": body.model, "output": output,
            "parallel_tool_calls": tools.parallel if tools is not None else True,
            "previous_response_id": body.previous_response_id,
            "temperature": _or(body.temperature), "top_p": _or(body.top_p),
            "tool_choice": _tool_choice(tools), "tools": [msgspec.to_builtins(t)
                                                          for t in body.tools or ()],
            "truncation": "disabled", "text": {"format": _format(body.text)},
            "usage": _usage(finish) if finish is not None else None,
            "metadata": body.metadata or {}, "user": body.user, "store": body.store,
            "background": False,
            "program_id": self.program.id, "session_id": self.program.session_id,
        }

    async def whole(self) -> dict[str, Any]:
        try:
            items: list[StreamItem] = []
            while (item := await self.req.stream.get()).finish is None and item.error is None:
                items.append(item)
        except BaseException:
            await self.core.abort(self.req.id, "client went away")
            raise
        finally:
            self._end_program()
        if item.error is not None:
            raise ApiError(503 if "worker" in item.error else 500, item.error, "engine_error")
        assert item.finish is not None
        response = self._finished("".join(i.text for i in items), item.finish)
        if not await _finish_recorded(self.core, self.since):
            raise ApiError(503, NOT_RECORDED, "store_unavailable")
        return response

    async def events(self) -> AsyncIterator[bytes]:
        events = Events(self.output, self.req.tools)
        done = False
        try:
            for frame in events.started(self.response("in_progress", [])):
                yield frame
            while (item := await self.req.stream.get()).finish is None and item.error is None:
                for frame in events.delta(item):
                    yield frame
            for frame in await self._last_events(events, item):
                yield frame
            done = True
        finally:
            if not done:
                await self.core.abort(self.req.id, "client went away")
            self._end_program()

    async def _last_events(self, events: Events, item: StreamItem) -> list[bytes]:
        """The items' ends and response.completed; error and response.failed instead when
        the engine failed or the store could not record the finish."""
        if item.finish is not None:
            response = self._finished(events.text, item.finish)
            if await _finish_recorded(self.core, self.since):
                return [*events.finished(response["output"]), events.completed(response)]
            code, message = "store_unavailable", NOT_RECORDED
        else:
            code, message = "engine_error", item.error or "engine error"
        failed = self.response("failed", [], error={"code": code, "message": message})
        return events.failed(failed, code, message)

    def _finished(self, text: str, finish: Finish) -> dict[str, Any]:
        """The response of a finished reply, queued for the store when it is kept."""
        tools = self.req.tools
        status = "incomplete" if finish.reason == "length" \
            and not chat_tools.calls_of(finish, tools) else "completed"
        response = self.response(status, self.output.items(text, finish, tools), finish)
        if self.body.store:
            conversation = [*self.conversation, Output.turn(text, finish, tools)]
            self.core.writer.insert("responses", {
                "id": self.id, "tenant": self.tenant, "session_id": self.program.session_id,
                "program_id": self.program.id,
                "previous_response_id": self.body.previous_response_id,
                "model": self.body.model, "status": status,
                "conversation": msgspec.to_builtins(conversation), "body": response,
                "created_at": time.time()})
        return response

    def _end_program(self) -> None:
        """Ends the program unless the client named it or lineage holds it."""
        if not self.named:
            _release_quietly(self.core, self.program.id)


def _tool_choice(tools: Tools | None) -> Any:
    if tools is None:
        return "auto"
    if tools.choice == "function":
        return {"type": "function", "name": tools.function}
    return tools.choice


def _format(text: TextConfig | None) -> dict[str, Any]:
    if text is None or text.format is None:
        return {"type": "text"}
    return dict(msgspec.to_builtins(text.format))


def _usage(finish: Finish) -> dict[str, Any]:
    return {
        "input_tokens": finish.prompt_tokens,
        "input_tokens_details": {"cached_tokens": finish.cached_tokens},
        "output_tokens": finish.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": finish.prompt_tokens + finish.output_tokens,
    }
