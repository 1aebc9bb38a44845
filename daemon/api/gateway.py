"""OpenAI-compatible gateway: /v1/models, /v1/completions, /v1/chat/completions.

A client opts into program-aware scheduling with `program_id` / `session_id`
(body fields, so `extra_body` works, or X-Program-Id / X-Session-Id headers).
Without them a chat request whose messages extend an earlier request's messages and
reply joins that request's program (lineage inference, daemon/core/lineage.py); any other
request is a program of its own, released when it ends, unless a later one may join it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.response import Stream

from daemon.access.auth import READ, SUBMIT, principal_of, run_program
from daemon.api import chat_tools
from daemon.api.chat_tools import ChatTool, InToolCall, NamedChoice
from daemon.api.errors import decode_body, error_body
from daemon.api.ids import id_problem
from daemon.api.limits import admit
from daemon.api.logprobs import MAX_TOP_LOGPROBS, chat_logprobs, completion_logprobs
from daemon.api.tenants import access_of, check_program, check_session, request_tenant
from daemon.core.core import Core
from daemon.core.tenants import open_program
from daemon.errors import ApiError
from daemon.state import ProgramState, ProgramStatus, RequestState, StreamItem
from daemon.workers.protocol import ChatMessage, Finish, SamplingParams
from db.writer import NotDurable

_json = msgspec.json.Encoder()
T = TypeVar("T")


# Every request struct forbids unknown fields: a field agentd does not read is a 400 that
# names it (decode_request), never silently dropped. Fields OpenAI clients send that agentd
# does not implement are declared and refused unless they hold their no-op value
# (_refuse_unsupported), so a client's defaults pass and a real ask fails loudly.


class ContentPart(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    text: str = ""


class InMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[InToolCall] | None = None
    tool_call_id: str | None = None
    # What a client echoes back with an assistant message of a reply; agentd's replies
    # never carry them, so only their empty values are accepted.
    refusal: None = None
    function_call: None = None
    audio: None = None
    annotations: list[None] | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    json_schema: JsonSchemaFormat | None = None


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
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
TopLogprobs = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)]
# OpenAI's bounds on metadata: 16 pairs of short strings.
Metadata = Annotated[dict[Annotated[str, msgspec.Meta(max_length=64)],
                          Annotated[str, msgspec.Meta(max_length=512)]],
                     msgspec.Meta(max_length=16)]


class _Common(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    max_tokens: MaxTokens | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: TopK = -1
    stop: str | list[str] | None = None
    seed: Seed | None = None
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Who asked, for the operator: recorded in the trace with the request (_record_client).
    user: str | None = None
    program_id: str | None = None
    session_id: str | None = None
    priority: Priority = 0
    tenant: str | None = None  # operator tokens only (daemon/core/tenants.py); or X-Tenant
    # Declared to be refused unless at their no-op value (_UNSUPPORTED).
    n: int | None = None
    logit_bias: dict[str, float] | None = None


class ChatRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    messages: list[InMessage]
    max_completion_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    metadata: Metadata | None = None
    safety_identifier: str | None = None  # OpenAI's newer name for `user`
    store: bool | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    service_tier: str | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None


class CompletionRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    prompt: str | list[str]
    logprobs: TopLogprobs | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


# Fields agentd declares but does not implement: (field, is its value a no-op, why not).
_UNSUPPORTED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("n", lambda v: v in (None, 1), "only n=1 is supported"),
    ("best_of", lambda v: v in (None, 1), "only best_of=1 is supported"),
    ("logit_bias", lambda v: not v, "logit_bias is not supported"),
    ("echo", lambda v: not v, "echo is not supported"),
    ("suffix", lambda v: not v, "suffix (insertion) is not supported"),
    ("store", lambda v: not v, "agentd does not store chat completions for retrieval; "
     "send store=false (the Responses API stores responses)"),
    ("reasoning_effort", lambda v: v is None, "the served models take no reasoning effort"),
    ("verbosity", lambda v: v is None, "verbosity is not supported"),
    ("modalities", lambda v: v in (None, ["text"]), "only text output is supported"),
    ("audio", lambda v: v is None, "audio output is not supported"),
    ("prediction", lambda v: v is None, "predicted outputs are not supported"),
    ("service_tier", lambda v: v in (None, "auto", "default"), "agentd has one service tier"),
    ("web_search_options", lambda v: v is None, "web search is not supported"),
    ("functions", lambda v: v is None, "the deprecated `functions` are not supported; send "
     "them as `tools`"),
    ("function_call", lambda v: v is None, "the deprecated `function_call` is not supported; "
     "send `tool_choice`"),
)


def decode_request(body: bytes, kind: type[T]) -> T:
    """decode_body, with a field agentd does not take named as such."""
    try:
        return decode_body(body, kind)
    except ApiError as exc:
        unknown = _UNKNOWN_FIELD.search(exc.message)
        if unknown is None:
            raise
        name, at = unknown.group(1), unknown.group(2)
        param = f"{at}.{name}" if at else name
        raise ApiError(400, f"unsupported field '{param}': agentd does not implement it, and "
                       "refuses it rather than ignore it", "unsupported_field",
                       param=param) from exc


_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]*)`(?: - at `\$\.?([^`]*)`)?")


def _refuse_unsupported(body: _Common) -> None:
    for name, is_no_op, why in _UNSUPPORTED:
        if hasattr(body, name) and not is_no_op(getattr(body, name)):
            raise ApiError(400, f"{name}: {why}", "unsupported_field", param=name)


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
        body = decode_request(await request.body(), ChatRequest)
        if not body.messages:
            raise ApiError(400, "'messages' must contain at least one message", param="messages")
        messages = [_message(m, i) for i, m in enumerate(body.messages)]
        tools = chat_tools.engine_tools(
            chat_tools.chat_functions(body.tools), *chat_tools.chat_choice(body.tool_choice),
            body.parallel_tool_calls)
        sampling = _sampling(core, body, body.max_completion_tokens or body.max_tokens,
                             _chat_logprobs(body))
        chat_tools.check_support(core, body.model, tools,
                                 chat_tools.uses_tools(tools, messages))
        schema = _output_schema(body.response_format)
        if schema is not None:
            sampling = msgspec.structs.replace(sampling, json_schema=_json.encode(schema).decode())
        tenant = await request_tenant(request, core, body.tenant)
        admit(request, core, chat_tools.prompt_chars(tools, messages), "messages", tenant)
        program = await _program(core, request, body, tenant, messages)
        req = core.submit(program, "chat", body.model, sampling, messages=messages,
                          priority=body.priority, tools=tools)
        _record_client(core, req, body.safety_identifier or body.user, body.metadata)
        return await _respond(core, request, req, body, program, chat=True)

    @post("/completions", status_code=200, opt={"scope": SUBMIT},
          summary="OpenAI text completions (streaming too)")
    async def completions(self, request: Request[Any, Any, Any], core: Core) -> Response[Any]:
        body = decode_request(await request.body(), CompletionRequest)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ApiError(400, "'prompt' must be one string (batched prompts are not "
                               "supported; send one request per prompt)", param="prompt")
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "'prompt' must not be empty", param="prompt")
        sampling = _sampling(core, body, body.max_tokens, body.logprobs)
        tenant = await request_tenant(request, core, body.tenant)
        admit(request, core, len(prompt), "prompt", tenant)
        program = await _program(core, request, body, tenant)
        req = core.submit(program, "completion", body.model, sampling, prompt=prompt,
                          priority=body.priority)
        _record_client(core, req, body.user, None)
        return await _respond(core, request, req, body, program, chat=False)


CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


def _message(message: InMessage, index: int) -> ChatMessage:
    """A chat message as the engines get it; what belongs to one role only is refused on
    the others, as OpenAI does."""
    at = f"messages[{index}]"
    if message.role not in CHAT_ROLES:
        raise ApiError(400, f"{at}.role '{message.role}' is not a chat role",
                       param=f"{at}.role")
    if message.tool_calls and message.role != "assistant":
        raise ApiError(400, f"{at}: only assistant messages carry tool_calls",
                       param=f"{at}.tool_calls")
    if (message.role == "tool") != (message.tool_call_id is not None):
        raise ApiError(400, f"{at}: a tool message, and only a tool message, names the "
                       "tool_call_id it answers", param=f"{at}.tool_call_id")
    calls = chat_tools.history_calls(message.tool_calls or [], f"{at}.tool_calls")
    return ChatMessage(role=message.role, content=_text(message, at), tool_calls=calls,
                       tool_call_id=message.tool_call_id, name=message.name)


def _text(message: InMessage, at: str) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    for j, part in enumerate(message.content):
        if part.type != "text":
            raise ApiError(400, f"{at}.content[{j}].type '{part.type}' is not supported; "
                           "the served models read text parts only",
                           param=f"{at}.content[{j}].type")
    return "".join(p.text for p in message.content)


def _output_schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """The JSON schema `response_format` asks the output to follow (None: free text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.type != "json_schema":
        raise ApiError(400, f"response_format.type '{fmt.type}' is not one of text, "
                       "json_object, json_schema", param="response_format.type")
    if fmt.json_schema is None or not isinstance(fmt.json_schema.schema, dict):
        raise ApiError(400, "response_format.json_schema.schema must be an object",
                       param="response_format")
    return fmt.json_schema.schema


def _chat_logprobs(body: ChatRequest) -> int | None:
    """The alternatives per token the engines return (None: no logprobs)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


def _record_client(core: Core, req: RequestState, user: str | None,
                   metadata: dict[str, str] | None) -> None:
    """The caller's end-user id and metadata, where an operator finds them: the trace."""
    if user is not None or metadata:
        core.writer.trace("request.client", session_id=req.session_id,
                          program_id=req.program_id, request_id=req.id, user=user,
                          metadata=metadata or {})


def _sampling(core: Core, body: _Common, max_tokens: int | None,
              logprobs: int | None = None) -> SamplingParams:
    if body.model not in {w.model for w in core.workers.values() if w.healthy}:
        if not any(w.healthy for w in core.workers.values()):
            raise ApiError(503, "no engine worker is registered yet; retry shortly",
                           "no_workers", headers={"Retry-After": "1"})
        raise ApiError(404, f"model '{body.model}' is not served here; GET /v1/models lists "
                       "the models", "model_not_found", param="model")
    _refuse_unsupported(body)
    limit = core.config.max_tokens_limit
    if max_tokens is not None and max_tokens > limit:
        raise ApiError(400, f"max_tokens {max_tokens} exceeds the limit of {limit}",
                       param="max_tokens")
    if body.temperature < 0 or not 0 < body.top_p <= 1:
        raise ApiError(400, "temperature must be >= 0 and top_p in (0, 1]", param="temperature")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return SamplingParams(
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS, temperature=body.temperature,
        top_p=body.top_p, top_k=body.top_k, stop=stop, seed=body.seed, logprobs=logprobs,
        frequency_penalty=body.frequency_penalty, presence_penalty=body.presence_penalty,
    )


async def _program(core: Core, request: Request[Any, Any, Any], body: _Common,
                   tenant: str, messages: list[ChatMessage] | None = None) -> ProgramState:
    """The program a request runs in: the one it names, else (a chat request's
    `messages`) the one lineage inference finds, else a new one."""
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
    return await open_program(core, program_id, session_id, tenant, messages)


def _usage(finish: Finish) -> dict[str, Any]:
    return {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.output_tokens,
        "total_tokens": finish.prompt_tokens + finish.output_tokens,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    }


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
    items, finish = await until_finish(core, req, program.id, ephemeral)
    if not await _finish_recorded(core, since):
        raise ApiError(503, NOT_RECORDED, "store_unavailable")
    choice = _choice(req, items, finish, chat)
    return Response({
        "id": req.id, "object": "chat.completion" if chat else "text_completion",
        "created": int(req.queued_at), "model": body.model,
        "choices": [choice], "usage": _usage(finish),
        "program_id": program.id, "session_id": program.session_id,
    }, headers=headers)


def _choice(req: RequestState, items: list[StreamItem], finish: Finish,
            chat: bool) -> dict[str, Any]:
    """The one choice of a whole (not streamed) completion."""
    text = "".join(i.text for i in items)
    tokens = [t for i in items for t in i.logprobs or ()]
    wants_logprobs = req.sampling.logprobs is not None
    if chat:
        return {"index": 0, "message": chat_tools.reply_message(text, finish, req.tools),
                "finish_reason": chat_tools.finish_reason(finish, req.tools),
                "logprobs": chat_logprobs(tokens) if wants_logprobs else None}
    return {"index": 0, "text": text, "finish_reason": chat_tools.finish_reason(finish, None),
            "logprobs": completion_logprobs(tokens) if wants_logprobs else None}


async def _sse(
    core: Core, req: RequestState, model: str, chat: bool, include_usage: bool, ephemeral: bool,
    since: int,
) -> AsyncIterator[bytes]:
    created = int(req.queued_at)
    obj = "chat.completion.chunk" if chat else "text_completion"
    wants_logprobs = req.sampling.logprobs is not None
    sent_chars = 0  # of a text completion, for its logprobs' offsets

    def chunk(payload: dict[str, Any], finish: str | None = None, usage: Any = None,
              logprobs: Any = None) -> bytes:
        if chat:
            choices = [{"index": 0, "delta": payload, "finish_reason": finish,
                        "logprobs": logprobs}]
        else:
            choices = [{"index": 0, "text": payload.get("content", ""), "finish_reason": finish,
                        "logprobs": logprobs}]
        data: dict[str, Any] = {"id": req.id, "object": obj, "created": created, "model": model,
                                "choices": choices if usage is None else [], "usage": usage}
        return b"data: " + _json.encode(data) + b"\n\n"

    def logprobs_of(item: StreamItem) -> Any:
        if not wants_logprobs or not item.logprobs:
            return None
        if chat:
            return chat_logprobs(item.logprobs)
        return completion_logprobs(item.logprobs, sent_chars)

    done = False
    try:
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        while True:
            item = await req.stream.get()
            if item.error is not None:
                error = error_body(_engine_status(item.error), item.error, "engine_error")
                yield b"data: " + _json.encode(error) + b"\n\n"
                break
            if item.finish is not None:
                if not await _finish_recorded(core, since):
                    error = error_body(503, NOT_RECORDED, "store_unavailable")
                    yield b"data: " + _json.encode(error) + b"\n\n"
                    break
                tools = req.tools if chat else None
                yield chunk({}, finish=chat_tools.finish_reason(item.finish, tools))
                if include_usage:
                    yield chunk({}, usage=_usage(item.finish))
                break
            delta = (chat_tools.stream_delta(item.text, item.message, req.tools) if chat
                     else {"content": item.text} if item.text else {})
            logprobs = logprobs_of(item)
            if delta or logprobs is not None:
                yield chunk(delta, logprobs=logprobs)
            sent_chars += len(item.text)
        done = True
        yield b"data: [DONE]\n\n"
    finally:
        if not done:
            await core.abort(req.id, "client went away")
        if ephemeral:
            _release_quietly(core, req.program_id)


NOT_RECORDED = "the completion finished but the store could not record it; retry the request"


async def until_finish(core: Core, req: RequestState, program_id: str, ephemeral: bool
                       ) -> tuple[list[StreamItem], Finish]:
    """A request answered whole: its items until its finish. A client that goes away aborts
    it; an ephemeral program (no id given) is released either way; an engine error is
    answered (503 when a worker failed it)."""
    items: list[StreamItem] = []
    try:
        while True:
            item = await req.stream.get()
            if item.finish is not None or item.error is not None:
                break
            items.append(item)
    except BaseException:
        await core.abort(req.id, "client went away")
        raise
    finally:
        if ephemeral:
            _release_quietly(core, program_id)
    if item.error is not None:
        raise ApiError(_engine_status(item.error), item.error, "engine_error")
    assert item.finish is not None
    return items, item.finish


def _engine_status(error: str) -> int:
    """A request the engine failed: 503 when the engine or its worker is gone (the client
    may retry; the worker is being replaced), else 502 (the upstream engine failed it)."""
    return 503 if "worker" in error or "EngineDeadError" in error else 502


async def _finish_recorded(core: Core, since: int) -> bool:
    """Whether the request's finish is committed: its row and its program's status, the
    two that crash recovery reads (daemon/core/recovery.py), were enqueued before the finish
    reached the reply. A reply waits for this, so a crash never records an answered
    completion as interrupted; many replies share one commit (BatchWriter.durable)."""
    try:
        await core.writer.durable(since)
    except NotDurable:
        return False  # the writer logged it and /healthz shows it
    return True


def _release_quietly(core: Core, program_id: str) -> None:
    program = core.programs.get(program_id)
    if program is not None and program.active_request is None \
            and not core.lineage.holds(program_id):  # it ends when idle (daemon/core/lineage.py)
        core.set_program_status(program, ProgramStatus.STOPPED, "single-request program ended")
