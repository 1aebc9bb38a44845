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
PROTOCOL_VERSION = 2


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = []
    seed: int | None = None
    # A JSON schema the output must follow, where the engine supports it.
    json_schema: str | None = None  # JSON text of the schema


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str


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
    # The daemon's worker key (daemon/worker_key.py): whoever can reach the socket but
    # cannot read the key file is refused and never sees a prompt.
    key: str = ""


class Heartbeat(msgspec.Struct, frozen=True, tag="heartbeat", kw_only=True):
    worker_id: str
    stats: WorkerStats


class TokenDelta(msgspec.Struct, frozen=True, tag="delta", kw_only=True):
    request_id: str
    text: str
    num_tokens: int
    # Present on the first delta of a request: prompt size as the engine counted it.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None


class Finish(msgspec.Struct, frozen=True, tag="finish", kw_only=True):
    request_id: str
    reason: str  # "stop" | "length" | "abort" | "error"
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None = None
    error: str | None = None


# --- daemon -> worker -------------------------------------------------------


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
    # Text already generated before a failover; the engine continues after it.
    continuation: str = ""
    sampling: SamplingParams = SamplingParams()
    priority: int = 0


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
