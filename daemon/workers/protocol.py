"""The engine worker protocol: msgspec structs, msgpack on the wire.

The daemon binds a ZeroMQ ROUTER; each worker connects a DEALER and sends one
multipart-free frame per message. Every message is a tagged struct of the
``Message`` union, so a single decoder reads them all. The schema hash covers
every struct's JSON schema: a worker built against a different protocol is
refused at registration instead of misreading frames later.
"""

from __future__ import annotations

import hashlib
import json

import msgspec

# 2: Register carries the worker key.
# 3: tool calling (tools and tool-call messages in, parsed replies out) and logprobs.
# 4: programmable contexts: token-id prompts with appended segments, generated token ids
#    back, regex / grammar / logit_bias sampling, token ids in logprobs.
# 5: residency from the engine's KV cache events in heartbeats.
# 6: Register names the worker's node and its data-parallel rank (workers placed by Ray,
#    daemon/workers/ray_placement.py): the KV layer prices a move across nodes as a recompute.
PROTOCOL_VERSION = 6


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = []
    seed: int | None = None
    # A JSON schema the output must follow, where the engine supports it.
    json_schema: str | None = None  # JSON text of the schema
    # Log probabilities of each output token and of this many likeliest alternatives
    # (0: the token's own only); None: none.
    logprobs: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # Structured output other than a JSON schema (at most one of the three is set): a
    # regular expression, or a grammar in the engine's grammar language (vLLM: EBNF/GBNF).
    regex: str | None = None
    grammar: str | None = None
    # Added to the logits of these token ids before sampling.
    logit_bias: dict[int, float] = {}


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """Text a context appends after its token ids, tokenized by the engine (which holds the
    tokenizer and the chat template): `text` as it is (kind "text"), a chat turn of `role`
    rendered by the template ("turn"; the first segment of an empty context gets the
    template's opening too), or the template's opening of an assistant reply ("reply")."""

    kind: str  # "text" | "turn" | "reply"
    text: str = ""
    role: str = ""


SEGMENT_KINDS = ("text", "turn", "reply")


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One function call of an assistant turn, as OpenAI's chat API spells it."""

    id: str
    name: str
    arguments: str  # JSON text of the arguments object


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str
    # An assistant turn's calls; a `tool` turn's answer names the call it answers.
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    name: str | None = None


class Tools(msgspec.Struct, frozen=True, kw_only=True):
    """A chat request's function tools and how the model may call them. The engine
    renders them through the chat template and parses the reply into calls."""

    functions: str  # JSON text of OpenAI's `tools` array ({"type": "function", ...} items)
    choice: str = "auto"  # "none" | "auto" | "required" | "function": the one named below
    function: str | None = None
    parallel: bool = True


class ToolSupport(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker's engine can do with tools."""

    # The parser that finds calls in free text (tool_choice "auto"); "" = none.
    parser: str = ""
    # Whether the chat template renders tools, calls and their results (else it drops them).
    template: bool = False


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True):
    """A piece of a streamed call: the first piece of call `index` has its id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class MessageDelta(msgspec.Struct, frozen=True, kw_only=True):
    """The parsed view of a delta of a request with tools: the part of it that is content
    (a parser holds back text that may start a call) and the call pieces it completes."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = []


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """A whole reply parsed into content and calls (requests with tools only)."""

    content: str | None = None
    tool_calls: list[ToolCall] = []


class TopLogprob(msgspec.Struct, frozen=True):
    token: str
    logprob: float
    token_id: int | None = None


class TokenLogprob(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    logprob: float
    top: list[TopLogprob] = []  # the likeliest tokens at this position, likeliest first
    token_id: int | None = None


class WorkerStats(msgspec.Struct, frozen=True, kw_only=True):
    kv_capacity_tokens: int
    kv_used_tokens: int
    running: int
    waiting: int
    # Counters are cumulative since the worker started; the daemon takes deltas.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    generated_tokens: int = 0


class ProgramResidency(msgspec.Struct, frozen=True, array_like=True):
    """What of a program's last context is still cached on the worker, from its engine's KV
    cache events (daemon/engines/kv_events.py), in tokens of whole blocks: the context its
    last request left in the KV (`context_tokens`), its leading part in the engine's own
    cache (`cached_tokens`), and in that cache or a lower tier the engine restores from
    without recompute, such as host memory (`reachable_tokens`)."""

    context_tokens: int
    cached_tokens: int
    reachable_tokens: int


# --- worker -> daemon -------------------------------------------------------


class Register(msgspec.Struct, frozen=True, tag="register", kw_only=True):
    worker_id: str
    engine: str  # "vllm" | "sim"
    model: str
    kv_capacity_tokens: int
    block_size: int
    max_batch: int
    schema_hash: str
    pid: int = 0
    host: str = ""
    # The daemon's worker key (daemon/workers/key.py): whoever can reach the socket but
    # cannot read the key file is refused and never sees a prompt.
    key: str = ""
    tools: ToolSupport = ToolSupport()
    # Its heartbeats report programs' residency from the engine's KV cache events.
    kv_events: bool = False
    # The machine (Ray node) it runs on: KV does not move between nodes, so a program moved
    # to a worker on another node recomputes its whole context. "" = the host name.
    node: str = ""
    # Its rank among the daemon's data-parallel replicas (Ray placement numbers them);
    # None for a worker started by hand without --dp-rank.
    dp_rank: int | None = None


class Heartbeat(msgspec.Struct, frozen=True, tag="heartbeat", kw_only=True):
    worker_id: str
    stats: WorkerStats
    # Residency of the programs whose residency changed since the last heartbeat (of all
    # it tracks, in the first heartbeat after registering), and those it stopped tracking.
    residency: dict[str, ProgramResidency] = {}
    residency_dropped: list[str] = []


class TokenDelta(msgspec.Struct, frozen=True, tag="delta", kw_only=True):
    request_id: str
    text: str
    num_tokens: int
    # Present on the first delta of a request: prompt size as the engine counted it.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    # Requests with tools: what of `text` is content and which call pieces it completes.
    message: MessageDelta | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, when sampling asked
    token_ids: list[int] = []  # the ids of this delta's tokens, in order


class Finish(msgspec.Struct, frozen=True, tag="finish", kw_only=True):
    request_id: str
    reason: str  # "stop" | "length" | "abort" | "error"
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None = None
    error: str | None = None
    # Requests with tools: the whole reply parsed (continuation included).
    reply: Reply | None = None
    # Requests with segments: the ids they tokenized to, in order (what now follows the
    # request's prompt_token_ids in the context).
    segment_token_ids: list[int] = []


# --- daemon -> worker -------------------------------------------------------


# A RegisterAck's message when the daemon does not know the sender of a message other than
# a Register (it restarted, or is a standby that took over): the worker registers again.
# Never the answer to a Register, so a worker waiting for one skips it (a late answer to
# a heartbeat it sent before).
REGISTER_AGAIN = "unknown worker: register again"


class RegisterAck(msgspec.Struct, frozen=True, tag="register_ack", kw_only=True):
    accepted: bool
    message: str = ""
    heartbeat_interval_s: float = 0.5


class Submit(msgspec.Struct, frozen=True, tag="submit", kw_only=True):
    request_id: str
    program_id: str
    context_id: str | None = None
    # Exactly one of prompt / prompt_token_ids / messages is set. The worker
    # applies the model's chat template to `messages`: the template lives with
    # the tokenizer, so it is applied in one place, the worker's engine.
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    # With prompt_token_ids only: appended after them, in order (a context's new turns).
    segments: list[Segment] = []
    # Text already generated before a failover; the engine continues after it.
    continuation: str = ""
    sampling: SamplingParams = SamplingParams()
    priority: int = 0
    tools: Tools | None = None


class Abort(msgspec.Struct, frozen=True, tag="abort", kw_only=True):
    request_id: str


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown"):
    pass


WorkerMessage = Register | Heartbeat | TokenDelta | Finish
DaemonMessage = RegisterAck | Submit | Abort | Shutdown
Message = WorkerMessage | DaemonMessage

_ALL_TYPES: tuple[type, ...] = (
    Register, Heartbeat, TokenDelta, Finish, RegisterAck, Submit, Abort, Shutdown,
)


def _schema_hash() -> str:
    _, components = msgspec.json.schema_components(_ALL_TYPES)
    text = json.dumps({"v": PROTOCOL_VERSION, "c": components}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


SCHEMA_HASH = _schema_hash()

_encoder = msgspec.msgpack.Encoder()
# Annotated: msgspec's stubs type a Decoder of a union as Decoder[Any].
_worker_decoder: msgspec.msgpack.Decoder[WorkerMessage] = msgspec.msgpack.Decoder(WorkerMessage)
_daemon_decoder: msgspec.msgpack.Decoder[DaemonMessage] = msgspec.msgpack.Decoder(DaemonMessage)


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol."""


class EncodeError(ValueError):
    """A message the wire cannot carry: an integer outside msgpack's 64 bits, a string
    that is not valid Unicode. The gateway's ranges keep requests from causing one."""


def encode(message: Message) -> bytes:
    try:
        return _encoder.encode(message)
    except (OverflowError, UnicodeEncodeError, TypeError, msgspec.EncodeError) as exc:
        raise EncodeError(f"{type(message).__name__} cannot be encoded: {exc}") from exc


def decode_from_worker(frame: bytes) -> WorkerMessage:
    try:
        return _worker_decoder.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(str(exc)) from exc


def decode_from_daemon(frame: bytes) -> DaemonMessage:
    try:
        return _daemon_decoder.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(str(exc)) from exc
