"""OpenAI-compatible gateway: /v1/models, /v1/completions, /v1/chat/completions.

A client opts into program-aware scheduling with `program_id` / `session_id`
(body fields, so `extra_body` works, or X-Program-Id / X-Session-Id headers).
Without them every request is its own program, released when it ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.response import Stream

from daemon.api.errors import ApiError, decode_body, error_body
from daemon.api.ids import id_problem
from daemon.api.tenants import access_of, check_program, check_session, request_tenant
from daemon.auth import READ, SUBMIT, principal_of, run_program
from daemon.core import Core
from daemon.limits import admit
from daemon.protocol import ChatMessage, Finish, SamplingParams
from daemon.state import ProgramState, ProgramStatus, RequestState
from daemon.tenancy import open_program
from db.writer import NotDurable

_json = msgspec.json.Encoder()


class ContentPart(msgspec.Struct):
    type: str
    text: str = ""


class InMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ResponseFormat(msgspec.Struct):
    type: str
    json_schema: dict[str, Any] | None = None


# The integers a request forwards to the engines, in the ranges they take: a seed is a
# signed 64-bit integer (vLLM's OpenAI server bounds it the same way), top_k an int32 (-1
# or 0: off), a priority an int32. Each fits the worker protocol's msgpack integers, so
# a request that passes these encodes (README, "The API").
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
TopK = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
Priority = Annotated[int, msgspec.Meta(ge=INT32_MIN, le=INT32_MAX)]
# At most the configured max_tokens_limit too (_sampling).
MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]


class _Common(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: MaxTokens | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: TopK = -1
    stop: str | list[str] | None = None
    seed: Seed | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    program_id: str | None = None
    session_id: str | None = None
    priority: Priority = 0
    tenant: str | None = None  # operator tokens only (daemon/tenancy.py); or X-Tenant


class ChatRequest(_Common, kw_only=True):
    messages: list[InMessage]
    max_completion_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str]


DEFAULT_MAX_TOKENS = 256


class GatewayController(Controller):
    path = "/v1"
    tags = ["openai"]

    @get("/models", opt={"scope": (READ, SUBMIT)},
         summary="Models served by the registered workers")
    async def models(self, core: Core) -> dict[str, Any]:
        names = sorted({w.model for w in core.workers.values() if w.healthy})
        return {"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "agentd"} for n in names]}

    @post("/chat/completions", status_code=200, opt={"scope": SUBMIT},
          summary="OpenAI chat completions (streaming too)")
    async def chat(self, request: Request[Any, Any, Any], core: Core) -> Response[Any]:
        body = decode_body(await request.body(), ChatRequest)
        if not body.messages:
            raise ApiError(400, "'messages' must contain at least one message", param="messages")
        messages = [ChatMessage(role=m.role, content=_text(m, i))
                    for i, m in enumerate(body.messages)]
        max_tokens = body.max_completion_tokens or body.max_tokens
        sampling = _sampling(core, body, max_tokens)
        if body.response_format is not None and body.response_format.type == "json_schema":
            schema = (body.response_format.json_schema or {}).get("schema")
            if not isinstance(schema, dict):
                raise ApiError(400, "response_format.json_schema.schema must be an object",
                               param="response_format")
            sampling = msgspec.structs.replace(sampling, json_schema=_json.encode(schema).decode())
        tenant = await request_tenant(request, core, body.tenant)
        admit(request, core, sum(len(m.content) for m in messages), "messages", tenant)
        program = await _program(core, request, body, tenant)
        req = core.submit(program, "chat", body.model, sampling, messages=messages,
                          priority=body.priority)
        return await _respond(core, request, req, body, program, chat=True)

    @post("/completions", status_code=200, opt={"scope": SUBMIT},
          summary="OpenAI text completions (streaming too)")
    async def completions(self, request: Request[Any, Any, Any], core: Core) -> Response[Any]:
        body = decode_body(await request.body(), CompletionRequest)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ApiError(400, "'prompt' must be one string (batched prompts are not "
                               "supported; send one request per prompt)", param="prompt")
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "'prompt' must not be empty", param="prompt")
        sampling = _sampling(core, body, body.max_tokens)
        tenant = await request_tenant(request, core, body.tenant)
        admit(request, core, len(prompt), "prompt", tenant)
        program = await _program(core, request, body, tenant)
        req = core.submit(program, "completion", body.model, sampling, prompt=prompt,
                          priority=body.priority)
        return await _respond(core, request, req, body, program, chat=False)


def _text(message: InMessage, index: int) -> str:
    if message.role not in ("system", "user", "assistant", "tool", "developer"):
        raise ApiError(400, f"messages[{index}].role '{message.role}' is not a chat role",
                       param=f"messages[{index}].role")
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return "".join(p.text for p in message.content if p.type == "text")


def _sampling(core: Core, body: _Common, max_tokens: int | None) -> SamplingParams:
    if body.model not in {w.model for w in core.workers.values() if w.healthy}:
        if not any(w.healthy for w in core.workers.values()):
            raise ApiError(503, "no engine worker is registered yet; retry shortly",
                           "no_workers", headers={"Retry-After": "1"})
        raise ApiError(404, f"model '{body.model}' is not served here; GET /v1/models lists "
                       "the models", "model_not_found", param="model")
    if body.n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    limit = core.config.max_tokens_limit
    if max_tokens is not None and max_tokens > limit:
        raise ApiError(400, f"max_tokens {max_tokens} exceeds the limit of {limit}",
                       param="max_tokens")
    if body.temperature < 0 or not 0 < body.top_p <= 1:
        raise ApiError(400, "temperature must be >= 0 and top_p in (0, 1]", param="temperature")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return SamplingParams(
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS, temperature=body.temperature,
        top_p=body.top_p, top_k=body.top_k, stop=stop, seed=body.seed,
    )


async def _program(core: Core, request: Request[Any, Any, Any], body: _Common,
                   tenant: str) -> ProgramState:
    program_id, program_field = body.program_id, "program_id"
    if program_id is None and "x-program-id" in request.headers:
        program_id, program_field = request.headers["x-program-id"], "X-Program-Id"
    session_id, session_field = body.session_id, "session_id"
    if session_id is None and "x-session-id" in request.headers:
        session_id, session_field = request.headers["x-session-id"], "X-Session-Id"
    for name, value in ((program_field, program_id), (session_field, session_id)):
        if value is not None and (problem := id_problem(value)) is not None:
            raise ApiError(400, f"{name} {problem}", param=name)
    program_id, session_id = run_program(principal_of(request), program_id, program_field,
                                         session_id, session_field)
    access = access_of(request)
    await check_program(core, access, program_id, program_field)
    await check_session(core, access, session_id, session_field)
    return await open_program(core, program_id, session_id, tenant)


def _usage(finish: Finish) -> dict[str, Any]:
    return {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.output_tokens,
        "total_tokens": finish.prompt_tokens + finish.output_tokens,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    }


def _finish_reason(finish: Finish) -> str:
    return "length" if finish.reason == "length" else "stop"


async def _respond(
    core: Core, request: Request[Any, Any, Any], req: RequestState, body: _Common,
    program: ProgramState, chat: bool,
) -> Response[Any]:
    ephemeral = body.program_id is None and "x-program-id" not in request.headers
    headers = {"X-Program-Id": program.id, "X-Session-Id": program.session_id,
               "X-Request-Id": req.id}
    # Taken straight after submit, before any await: no batch can have taken the request's
    # row yet, so a failed commit of it, or of its finish, shows in this mark.
    since = core.writer.mark()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Stream(
            _sse(core, req, body.model, chat, include_usage, ephemeral, since),
            media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"},
        )
    try:
        parts: list[str] = []
        while True:
            item = await req.stream.get()
            if item.finish is not None or item.error is not None:
                break
            parts.append(item.text)
    except BaseException:
        await core.abort(req.id, "client went away")
        raise
    finally:
        if ephemeral:
            _release_quietly(core, program.id)
    if item.error is not None:
        raise ApiError(503 if "worker" in item.error else 500, item.error, "engine_error")
    assert item.finish is not None
    if not await _finish_recorded(core, since):
        raise ApiError(503, NOT_RECORDED, "store_unavailable")
    text = "".join(parts)
    created = int(req.queued_at)
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": _finish_reason(item.finish), "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": _finish_reason(item.finish),
                  "logprobs": None}
        obj = "text_completion"
    return Response({
        "id": req.id, "object": obj, "created": created, "model": body.model,
        "choices": [choice], "usage": _usage(item.finish),
        "program_id": program.id, "session_id": program.session_id,
    }, headers=headers)


async def _sse(
    core: Core, req: RequestState, model: str, chat: bool, include_usage: bool, ephemeral: bool,
    since: int,
) -> AsyncIterator[bytes]:
    created = int(req.queued_at)
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(payload: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
        if chat:
            choices = [{"index": 0, "delta": payload, "finish_reason": finish, "logprobs": None}]
        else:
            choices = [{"index": 0, "text": payload.get("content", ""), "finish_reason": finish,
                        "logprobs": None}]
        data: dict[str, Any] = {"id": req.id, "object": obj, "created": created, "model": model,
                                "choices": choices if usage is None else [], "usage": usage}
        return b"data: " + _json.encode(data) + b"\n\n"

    done = False
    try:
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        while True:
            item = await req.stream.get()
            if item.error is not None:
                error = error_body(500, item.error, "engine_error")
                yield b"data: " + _json.encode(error) + b"\n\n"
                break
            if item.finish is not None:
                if not await _finish_recorded(core, since):
                    error = error_body(503, NOT_RECORDED, "store_unavailable")
                    yield b"data: " + _json.encode(error) + b"\n\n"
                    break
                yield chunk({}, finish=_finish_reason(item.finish))
                if include_usage:
                    yield chunk({}, usage=_usage(item.finish))
                break
            if item.text:
                yield chunk({"content": item.text})
        done = True
        yield b"data: [DONE]\n\n"
    finally:
        if not done:
            await core.abort(req.id, "client went away")
        if ephemeral:
            _release_quietly(core, req.program_id)


NOT_RECORDED = "the completion finished but the store could not record it; retry the request"


async def _finish_recorded(core: Core, since: int) -> bool:
    """Whether the request's finish is committed: its row and its program's status, the
    two that crash recovery reads (daemon/recovery.py), were enqueued before the finish
    reached the reply. A reply waits for this, so a crash never records an answered
    completion as interrupted; many replies share one commit (BatchWriter.durable)."""
    try:
        await core.writer.durable(since)
    except NotDurable:
        return False  # the writer logged it and /healthz shows it
    return True


def _release_quietly(core: Core, program_id: str) -> None:
    program = core.programs.get(program_id)
    if program is not None and program.active_request is None:
        core.set_program_status(program, ProgramStatus.STOPPED, "single-request program ended")
