"""The daemon's live, in-memory view of workers, programs and requests.

The store holds the durable copy; these objects hold what the scheduler needs
on every event without touching disk.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from daemon.workers.protocol import (
    ChatMessage,
    Finish,
    MessageDelta,
    ProgramResidency,
    SamplingParams,
    Segment,
    TokenLogprob,
    Tools,
    ToolSupport,
    WorkerStats,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from daemon.config import Config
    from db.writer import BatchWriter


class ProgramStatus(enum.StrEnum):
    QUEUED = "QUEUED"
    REASONING = "REASONING"
    ACTING = "ACTING"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


# The statuses in which a program's KV is on its worker.
RESIDENT = (ProgramStatus.REASONING, ProgramStatus.ACTING)


class RequestStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class WorkerState:
    id: str
    identity: bytes
    engine: str
    model: str
    kv_capacity_tokens: int
    block_size: int
    max_batch: int
    pid: int
    host: str
    registered_at: float
    last_seen: float
    node: str = ""  # the machine (Ray node) it runs on; KV never moves between nodes
    dp_rank: int | None = None  # its data-parallel rank, when its placer gave it one
    status: str = "healthy"
    stats: WorkerStats | None = None
    inflight: set[str] = field(default_factory=set)
    tools: ToolSupport = field(default_factory=ToolSupport)  # what its engine does with tools
    # Its heartbeats report programs' residency from the engine's KV cache events; the
    # last report of each program it tracks (daemon/kv/residency.py reads them).
    kv_events: bool = False
    residency: dict[str, ProgramResidency] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.status == "healthy"

    @property
    def has_slot(self) -> bool:
        return self.healthy and len(self.inflight) < self.max_batch


@dataclass
class ProgramState:
    id: str
    session_id: str
    status: ProgramStatus
    created_at: float
    status_since: float
    worker_id: str | None = None
    # The node of the worker its last request ran on: its KV lives there (a worker that
    # restarted under the same id on another node does not have it).
    kv_node: str | None = None
    context_tokens: int = 0
    steps: int = 0
    pinned: bool = False
    active_request: str | None = None
    # KV scheduling bookkeeping (see daemon/kv/loop.py).
    ready_request: str | None = None  # queued, waiting for admission or restore
    ready_since: float | None = None
    acting_since: float | None = None
    pause_marked: bool = False
    held: bool = False  # paused by an operator: the KV policy neither sees nor restores it
    migrate_to: str | None = None
    # The last recorded admit/restore (worker, waiting request): a policy repeats it every
    # tick while the admission fence holds the request, and the trace needs it once.
    kv_grant: tuple[str, str | None] | None = None
    tool_time_sum: float = 0.0
    tool_time_count: int = 0
    # The leading tokens its last context shares with other programs (a context opened
    # from a snapshot, daemon/api/contexts.py): the KV view's prefix group, held once.
    prefix_group: str | None = None
    prefix_tokens: int = 0
    # Bumped by every assignment to a field: the KV view's cache (daemon/kv/loop.py)
    # compares this one number, not each field a view is built from, for every live
    # program on every routed request.
    revision: ClassVar[int] = 0

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        object.__setattr__(self, "revision", self.revision + 1)

    @property
    def tool_time_mean_s(self) -> float | None:
        return self.tool_time_sum / self.tool_time_count if self.tool_time_count else None


@dataclass
class StreamItem:
    """What a request's consumer (the HTTP handler) receives, in order."""

    text: str = ""
    num_tokens: int = 0
    finish: Finish | None = None
    error: str | None = None
    message: MessageDelta | None = None  # requests with tools: the parsed view of `text`
    logprobs: list[TokenLogprob] | None = None
    token_ids: list[int] = field(default_factory=list)


@dataclass
class RequestState:
    id: str
    program_id: str
    session_id: str
    kind: str  # chat | completion
    model: str
    sampling: SamplingParams
    queued_at: float
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    priority: int = 0
    tools: Tools | None = None
    prompt_token_ids: list[int] | None = None  # a prompt already tokenized (the replay's)
    segments: list[Segment] | None = None  # a context's new turns after prompt_token_ids
    status: RequestStatus = RequestStatus.QUEUED
    worker_id: str | None = None
    dispatched_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    generated: list[str] = field(default_factory=list)
    failovers: int = 0
    stream: asyncio.Queue[StreamItem] = field(default_factory=asyncio.Queue)

    @property
    def text_so_far(self) -> str:
        return "".join(self.generated)


# The daemon does not tokenize: a text prompt's size is estimated from its characters,
# plus the chat template's markers per message.
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def prompt_estimate(req: RequestState) -> int:
    """The request's prompt in tokens: the engine's count once known, the ids given, else
    an estimate from the text (what the SLO tags and the KV view size a request by)."""
    if req.prompt_tokens:
        return req.prompt_tokens
    if req.prompt_token_ids is not None:
        return len(req.prompt_token_ids)
    if req.messages is None:
        return len(req.prompt or "") // CHARS_PER_TOKEN
    chars = sum(len(m.content) for m in req.messages)
    return chars // CHARS_PER_TOKEN + TOKENS_PER_MESSAGE * len(req.messages)


class Host(Protocol):
    """What the core offers the layers it drives (the KV loop, the SLO stack): its state,
    its clock, the store, and the effects they may ask of it. They take this, not Core."""

    config: Config
    programs: dict[str, ProgramState]
    requests: dict[str, RequestState]
    workers: dict[str, WorkerState]
    writer: BatchWriter
    sessions: async_sessionmaker[AsyncSession]
    clock: Callable[[], float]

    def pump(self) -> None:
        """Dispatch what may run now."""

    def requeue(self, request_id: str, reason: str) -> None:
        """Take a running request back from its worker into the global queue."""

    def set_program_status(self, program: ProgramState, status: ProgramStatus,
                           reason: str) -> None: ...
