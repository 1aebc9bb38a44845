"""Programmable contexts (agentd.Context): generate on token ids, and named snapshots.

A context lives in the program that holds it, as token ids (agentd/context.py): every
generate sends the ids it holds plus the segments it appended since (turns and text the
worker tokenizes, daemon/workers/protocol.Segment), and gets back the ids of both, so the
next generate sends exactly the tokens the engine saw and produced. Reuse between calls,
forks and programs is the engine's prefix cache.

- `POST /v1/contexts/generate`: one generate (or, with `fill_only`, one prefill).
- `POST /v1/contexts/idle`: the program waits on a tool (`with ctx.idle():`).
- `POST /v1/contexts/pin`: the program is never paused while pinned (daemon/api/context_pins.py).
- `POST /v1/contexts/fork`, `POST /v1/contexts/drop`: a program forked or dropped a context
  (both happen in the program, on ids it holds): recorded in its session's trace.
- `PUT|GET|DELETE /v1/contexts/snapshots/{name}`: a named prefix of the caller's tenant
  (daemon/api/snapshots.py); another tenant's name is unknown (404).

The program and session a generate names go through the tenancy checks the gateway uses.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post, put

from daemon.access.auth import READ, SUBMIT, grants, principal_of
from daemon.api import context_pins, context_warm
from daemon.api import context_snapshots as snapshots
from daemon.api.gateway import (
    DEFAULT_MAX_TOKENS,
    INT32_MAX,
    MaxTokens,
    Penalty,
    Priority,
    Seed,
    TopK,
    TopLogprobs,
    _Common,
    _finish_recorded,
    _program,
    decode_request,
    until_finish,
)
from daemon.api.ids import id_problem
from daemon.api.limits import admit
from daemon.api.tenants import request_tenant
from daemon.core.core import Core
from daemon.errors import ApiError
from daemon.state import ProgramState, RequestState, StreamItem
from daemon.workers.protocol import SEGMENT_KINDS, Finish, SamplingParams, Segment, TokenLogprob

TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
MAX_CONTEXT_TOKENS = 1 << 20
TokenIds = Annotated[list[TokenId], msgspec.Meta(max_length=MAX_CONTEXT_TOKENS)]


class InSegment(msgspec.Struct, forbid_unknown_fields=True):
    kind: str
    text: str = ""
    role: str = ""


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    token_ids: TokenIds = []
    segments: list[InSegment] = []
    # Prefill only: the engine samples one token (it must), which is not kept.
    fill_only: bool = False
    max_tokens: MaxTokens | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: TopK = -1
    stop: list[str] = []
    seed: Seed | None = None
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    regex: str | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    logit_bias: dict[str, float] = {}
    logprobs: TopLogprobs | None = None
    program_id: str | None = None
    session_id: str | None = None
    priority: Priority = 0
    tenant: str | None = None
    # The tenant's snapshot the context was opened from (Context.open): while its ids still
    # lead token_ids, the program shares them with every program opened from it, and the
    # KV view holds them once (a prefix group); the answer's `shared_prefix_tokens` says.
    snapshot: str | None = None


class IdleRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    program_id: str
    state: str  # "start" | "end"
    session_id: str | None = None
    tenant: str | None = None


class PinRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    program_id: str
    pinned: bool
    session_id: str | None = None
    tenant: str | None = None


MAX_FORK = 1024


class NoteRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A fork or a drop the program made: `tokens` the context held, `n` the children."""

    program_id: str
    tokens: Annotated[int, msgspec.Meta(ge=0, le=MAX_CONTEXT_TOKENS)]
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_FORK)] = 1
    session_id: str | None = None
    tenant: str | None = None


class ContextsController(Controller):
    path = "/v1/contexts"
    tags = ["contexts"]

    @post("/generate", status_code=200, opt={"scope": SUBMIT},
          summary="Generate on a context's token ids (agentd.Context)")
    async def generate(self, request: Request[Any, Any, Any], core: Core) -> Response[Any]:
        body = decode_request(await request.body(), GenerateRequest)
        segments = [_segment(s, i) for i, s in enumerate(body.segments)]
        if not body.token_ids and not segments:
            raise ApiError(400, "a context needs token_ids or segments to generate on",
                           param="token_ids")
        sampling = _sampling(core, body)
        tenant = await request_tenant(request, core, body.tenant)
        # Each token counts as one character against max_prompt_chars: a lower bound.
        admit(request, core, len(body.token_ids) + sum(len(s.text) for s in segments),
              "token_ids", tenant)
        ids = _Common(model=body.model, program_id=body.program_id, session_id=body.session_id)
        shared = _shared_prefix(request, tenant, body)
        program = await _program(core, request, ids, tenant)
        await context_warm.settled(request, program.id)
        # Set before the submit, so the view that routes this request sees the group.
        program.prefix_group, program.prefix_tokens = shared
        req = core.submit(program, "context", body.model, sampling,
                          prompt_token_ids=list(body.token_ids), segments=segments,
                          priority=body.priority)
        return await _respond(core, request, req, body, program, shared[1])

    @post("/idle", status_code=200, opt={"scope": SUBMIT},
          summary="A program's tool wait starts or ends (Context.idle)")
    async def idle(self, request: Request[Any, Any, Any], core: Core) -> dict[str, Any]:
        """The KV layer sees the wait as a tool span, as for a tool agentd runs: the
        program is ACTING from its start, so the KV policy may pause it meanwhile."""
        body = decode_request(await request.body(), IdleRequest)
        if body.state not in ("start", "end"):
            raise ApiError(400, "state must be 'start' or 'end'", param="state")
        tenant = await request_tenant(request, core, body.tenant)
        ids = _Common(model="", program_id=body.program_id, session_id=body.session_id)
        program = await _program(core, request, ids, tenant)
        now = core.clock()
        if body.state == "start":
            core.kv.tool_started(program.id, now)
            span = None
        else:
            span = core.kv.tool_ended(program.id, now)
        core.writer.trace(f"context.idle.{body.state}", session_id=program.session_id,
                          program_id=program.id, at=now, span_s=span)
        return {"program_id": program.id, "state": body.state, "span_s": span}

    @post("/pin", status_code=200, opt={"scope": SUBMIT},
          summary="Pin or unpin a context's program (Context.pin): never paused while pinned")
    async def pin(self, request: Request[Any, Any, Any], core: Core) -> dict[str, Any]:
        body = decode_request(await request.body(), PinRequest)
        tenant = await request_tenant(request, core, body.tenant)
        ids = _Common(model="", program_id=body.program_id, session_id=body.session_id)
        program = await _program(core, request, ids, tenant)
        context_pins.of(request).set(core, program, tenant, body.pinned)
        return {"program_id": program.id, "pinned": program.pinned}

    @post("/fork", status_code=200, opt={"scope": SUBMIT},
          summary="A program forked a context (Context.fork): recorded in its trace")
    async def fork(self, request: Request[Any, Any, Any], core: Core) -> dict[str, Any]:
        return await _note(request, core, "fork")

    @post("/drop", status_code=200, opt={"scope": SUBMIT},
          summary="A program dropped a context (Context.drop): recorded in its trace")
    async def drop(self, request: Request[Any, Any, Any], core: Core) -> dict[str, Any]:
        return await _note(request, core, "drop")

    @put("/snapshots/{name:str}", status_code=200, opt={"scope": SUBMIT},
         summary="Keep a context's token ids under a name, for the caller's tenant")
    async def put_snapshot(self, request: Request[Any, Any, Any], core: Core,
                           name: str) -> dict[str, Any]:
        body = decode_request(await request.body(), snapshots.SnapshotIn)
        _check_name(name)
        if not body.token_ids:
            raise ApiError(400, "a snapshot holds at least one token", param="token_ids")
        tenant = await request_tenant(request, core, body.tenant)
        # The program taking it, when named: checked like any other, so the trace is its.
        program = None if body.program_id is None else await _program(
            core, request, _Common(model="", program_id=body.program_id,
                                   session_id=body.session_id), tenant)
        snapshot = snapshots.of(request).put(tenant, name, body.model, list(body.token_ids))
        if program is not None:
            # Its context leads with the snapshot's ids from now on, as an opener's does.
            program.prefix_group, program.prefix_tokens = _group(tenant, name), len(body.token_ids)
        core.writer.trace("context.snapshot", name=name, tokens=len(snapshot.token_ids),
                          session_id=program.session_id if program else None,
                          program_id=program.id if program else None)
        return snapshot.summary()

    @get("/snapshots/{name:str}", opt={"scope": (READ, SUBMIT)},
         summary="A snapshot's token ids; with program_id, opened by that program")
    async def get_snapshot(self, request: Request[Any, Any, Any], core: Core,
                           name: str) -> dict[str, Any]:
        """With `program_id` (Context.open in a program), the program opens it: traced,
        and filled on the program's worker when the engine's KV events say it went cold
        there (daemon/api/context_warm.py); `warm` says what was found."""
        _check_name(name)
        query = request.query_params
        tenant = await request_tenant(request, core, query.get("tenant"))
        snapshot = snapshots.of(request).get(tenant, name)
        program_id = query.get("program_id")
        if program_id is None:
            return snapshot.body()
        principal = principal_of(request)
        if principal is None or not grants(principal.scopes, (SUBMIT,)):
            raise ApiError(403, "program_id: opening a snapshot in a program needs the "
                           "submit scope", "forbidden", param="program_id")
        program = await _program(core, request, _Common(
            model="", program_id=program_id, session_id=query.get("session_id")), tenant)
        warmth = context_warm.open_for(request, core, program, name, _group(tenant, name),
                                       snapshot.model, snapshot.token_ids)
        core.writer.trace("context.open", session_id=program.session_id,
                          program_id=program.id, name=name, tokens=len(snapshot.token_ids),
                          **warmth.body())
        return {**snapshot.body(), "warm": warmth.body()}

    @delete("/snapshots/{name:str}", status_code=204, opt={"scope": SUBMIT},
            summary="Forget a snapshot")
    async def delete_snapshot(self, request: Request[Any, Any, Any], core: Core,
                              name: str) -> None:
        _check_name(name)
        tenant = await request_tenant(request, core, request.query_params.get("tenant"))
        snapshots.of(request).delete(tenant, name)


async def _note(request: Request[Any, Any, Any], core: Core, kind: str) -> dict[str, Any]:
    body = decode_request(await request.body(), NoteRequest)
    if kind == "drop" and body.n != 1:
        raise ApiError(400, "n: a drop drops one context", param="n")
    tenant = await request_tenant(request, core, body.tenant)
    ids = _Common(model="", program_id=body.program_id, session_id=body.session_id)
    program = await _program(core, request, ids, tenant)
    extra = {"children": body.n} if kind == "fork" else {}
    core.writer.trace(f"context.{kind}", session_id=program.session_id,
                      program_id=program.id, tokens=body.tokens, **extra)
    return {"program_id": program.id, "kind": kind, "tokens": body.tokens, **extra}


def _shared_prefix(request: Request[Any, Any, Any], tenant: str,
                   body: GenerateRequest) -> tuple[str | None, int]:
    """(prefix group, its tokens) of a context opened from a snapshot, or (None, 0) when
    it names none, or names one since deleted or replaced (its ids no longer lead)."""
    if body.snapshot is None:
        return None, 0
    if (problem := id_problem(body.snapshot)) is not None:
        raise ApiError(400, f"snapshot {problem}", param="snapshot")
    try:
        ids = snapshots.of(request).get(tenant, body.snapshot).token_ids
    except ApiError:
        return None, 0
    if tuple(body.token_ids[:len(ids)]) != ids:
        return None, 0
    return _group(tenant, body.snapshot), len(ids)


def _group(tenant: str, name: str) -> str:
    """The KV layer's prefix group of the programs that opened a snapshot."""
    return f"snapshot:{tenant}/{name}"


def _check_name(name: str) -> None:
    if (problem := id_problem(name)) is not None:
        raise ApiError(400, f"name {problem}", param="name")


def _segment(segment: InSegment, index: int) -> Segment:
    at = f"segments[{index}]"
    if segment.kind not in SEGMENT_KINDS:
        raise ApiError(400, f"{at}.kind must be one of {', '.join(SEGMENT_KINDS)}",
                       param=f"{at}.kind")
    if segment.kind == "turn" and not segment.role:
        raise ApiError(400, f"{at}.role: a turn names its role", param=f"{at}.role")
    if segment.kind != "turn" and segment.role:
        raise ApiError(400, f"{at}.role: only a turn has a role", param=f"{at}.role")
    if segment.kind == "reply" and segment.text:
        raise ApiError(400, f"{at}.text: a reply segment opens a reply and holds no text",
                       param=f"{at}.text")
    return Segment(kind=segment.kind, text=segment.text, role=segment.role)


# Sampling only real logits can honour: refused on a model that any simulated worker serves.
_NEEDS_LOGITS = ("regex", "grammar", "logit_bias")


def _sampling(core: Core, body: GenerateRequest) -> SamplingParams:
    _served(core, body.model)
    limit = core.config.max_tokens_limit
    if body.max_tokens is not None and body.max_tokens > limit:
        raise ApiError(400, f"max_tokens {body.max_tokens} exceeds the limit of {limit}",
                       param="max_tokens")
    if body.fill_only and (body.max_tokens is not None or body.logprobs is not None):
        raise ApiError(400, "fill_only prefills and generates nothing: max_tokens and "
                       "logprobs do not apply", param="fill_only")
    if body.temperature < 0:
        raise ApiError(400, "temperature must be >= 0", param="temperature")
    if not 0 < body.top_p <= 1:
        raise ApiError(400, "top_p must be in (0, 1]", param="top_p")
    constraints = [n for n in ("regex", "json_schema", "grammar") if getattr(body, n) is not None]
    if len(constraints) > 1:
        raise ApiError(400, f"at most one of regex, json_schema and grammar: got "
                       f"{' and '.join(constraints)}", param=constraints[1])
    _check_engines(core, body)
    return SamplingParams(
        max_tokens=1 if body.fill_only else body.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, stop=body.stop,
        seed=body.seed, logprobs=body.logprobs, frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty, regex=body.regex, grammar=body.grammar,
        json_schema=msgspec.json.encode(body.json_schema).decode()
        if body.json_schema is not None else None,
        logit_bias=_logit_bias(body.logit_bias),
    )


def _served(core: Core, model: str) -> None:
    if model in {w.model for w in core.workers.values() if w.healthy}:
        return
    if not any(w.healthy for w in core.workers.values()):
        raise ApiError(503, "no engine worker is registered yet; retry shortly", "no_workers",
                       headers={"Retry-After": "1"})
    raise ApiError(404, f"model '{model}' is not served here; GET /v1/models lists the "
                   "models", "model_not_found", param="model")


def _check_engines(core: Core, body: GenerateRequest) -> None:
    engines = {w.engine for w in core.workers.values() if w.healthy and w.model == body.model}
    for name in _NEEDS_LOGITS:
        if getattr(body, name) and "sim" in engines:
            raise ApiError(400, f"{name}: model '{body.model}' is served by the simulated "
                           "engine, which has no real logits to constrain or bias",
                           "unsupported_field", param=name)


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not key.isdigit() or int(key) > INT32_MAX:
            raise ApiError(400, f"logit_bias: key {key!r} is not a token id",
                           param="logit_bias")
        if not -100 <= value <= 100:
            raise ApiError(400, f"logit_bias[{key}]: a bias is in [-100, 100]",
                           param="logit_bias")
        out[int(key)] = value
    return out


async def _respond(core: Core, request: Request[Any, Any, Any], req: RequestState,
                   body: GenerateRequest, program: ProgramState,
                   shared_tokens: int) -> Response[Any]:
    ephemeral = body.program_id is None and "x-program-id" not in request.headers
    since = core.writer.mark()
    items, finish = await until_finish(core, req, program.id, ephemeral)
    if body.fill_only:
        core.writer.trace("context.fill", session_id=program.session_id,
                          program_id=program.id, request_id=req.id,
                          tokens=finish.prompt_tokens, cached_tokens=finish.cached_tokens)
    if not await _finish_recorded(core, since):
        raise ApiError(503, "the generate finished but the store could not record it; retry",
                       "store_unavailable")
    headers = {"X-Program-Id": program.id, "X-Session-Id": program.session_id,
               "X-Request-Id": req.id}
    return Response(_answer(req, items, finish, body.fill_only, shared_tokens),
                    headers=headers)


def _answer(req: RequestState, items: list[StreamItem], finish: Finish,
            fill_only: bool, shared_prefix_tokens: int) -> dict[str, Any]:
    tokens = [t for i in items for t in i.logprobs or ()]
    return {
        "id": req.id, "model": req.model, "program_id": req.program_id,
        "session_id": req.session_id,
        "segment_token_ids": finish.segment_token_ids,
        "token_ids": [] if fill_only else [t for i in items for t in i.token_ids],
        "text": "" if fill_only else "".join(i.text for i in items),
        "finish_reason": "fill" if fill_only else finish.reason,
        "logprobs": None if req.sampling.logprobs is None else [_logprob(t) for t in tokens],
        "shared_prefix_tokens": shared_prefix_tokens,
        "usage": {"prompt_tokens": finish.prompt_tokens,
                  "cached_tokens": finish.cached_tokens,
                  "completion_tokens": 0 if fill_only else finish.output_tokens},
    }


def _logprob(token: TokenLogprob) -> dict[str, Any]:
    return {"token": token.token, "token_id": token.token_id, "logprob": token.logprob,
            "top": [{"token": t.token, "token_id": t.token_id, "logprob": t.logprob}
                    for t in token.top]}
