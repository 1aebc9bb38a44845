"""The store's tables. Times are UNIX seconds (float): cheap to write, easy to diff."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# 64-bit integers: BIGINT on PostgreSQL (whose SERIAL key would stop at 2^31 rows),
# INTEGER on SQLite, which is 64-bit already and, for a key, the rowid alias (BIGINT is not).
Int64 = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    engine: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(256))
    kv_capacity_tokens: Mapped[int] = mapped_column(Integer)
    block_size: Mapped[int] = mapped_column(Integer)
    max_batch: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # healthy | suspect | unhealthy | gone
    pid: Mapped[int] = mapped_column(Integer, default=0)
    host: Mapped[str] = mapped_column(String(256), default="")
    registered_at: Mapped[float] = mapped_column(Float)
    last_seen_at: Mapped[float] = mapped_column(Float)


class Session(Base):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), default="default")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    slo_class: Mapped[str] = mapped_column(String(64), default="default")
    pinned_worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class Program(Base):
    __tablename__ = "programs"
    __table_args__ = (
        Index("ix_programs_session", "session_id"),
        Index("ix_programs_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    status: Mapped[str] = mapped_column(String(16))
    worker_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    context_tokens: Mapped[int] = mapped_column(Integer, default=0)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    status_reason: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[float] = mapped_column(Float)
    status_since: Mapped[float] = mapped_column(Float)
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Context(Base):
    __tablename__ = "contexts"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    program_id: Mapped[str] = mapped_column(ForeignKey("programs.id"))
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)


class Request(Base):
    __tablename__ = "requests"
    __table_args__ = (Index("ix_requests_program", "program_id"),)

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    program_id: Mapped[str] = mapped_column(ForeignKey("programs.id"))
    session_id: Mapped[str] = mapped_column(String(128))
    context_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    kind: Mapped[str] = mapped_column(String(16))  # chat | completion
    model: Mapped[str] = mapped_column(String(256))
    # queued | running | finished | aborted | failed
    status: Mapped[str] = mapped_column(String(16))
    worker_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_tokens: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    failovers: Mapped[int] = mapped_column(Integer, default=0)
    queued_at: Mapped[float] = mapped_column(Float)
    dispatched_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_token_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Future(Base):
    __tablename__ = "futures"
    __table_args__ = (Index("ix_futures_program", "program_id"),)

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    program_id: Mapped[str] = mapped_column(ForeignKey("programs.id"))
    session_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))  # llm | tool | agent
    status: Mapped[str] = mapped_column(String(16))
    creator: Mapped[str | None] = mapped_column(String(128), nullable=True)
    executor: Mapped[str | None] = mapped_column(String(128), nullable=True)
    consumers: Mapped[list[Any]] = mapped_column(JSON, default=list)
    dependencies: Mapped[list[Any]] = mapped_column(JSON, default=list)
    value: Mapped[Any] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ToolContainer(Base):
    __tablename__ = "tool_containers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    program_id: Mapped[str] = mapped_column(String(128))
    tool: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(16))
    container_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    disk_bytes: Mapped[int] = mapped_column(Int64, default=0)  # may pass 2 GiB
    created_at: Mapped[float] = mapped_column(Float)
    removed_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Policy(Base):
    __tablename__ = "policies"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    layer: Mapped[str] = mapped_column(String(16))
    active_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class PolicyVersion(Base):
    __tablename__ = "policy_versions"
    __table_args__ = (Index("ix_policy_versions_name", "policy_name", "version", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    policy_name: Mapped[str] = mapped_column(ForeignKey("policies.name"))
    version: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(Text)
    author: Mapped[str] = mapped_column(String(128), default="")
    status: Mapped[str] = mapped_column(String(16))  # draft | active | retired | rolled_back
    validation_report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)


class TraceEvent(Base):
    __tablename__ = "trace_events"
    __table_args__ = (
        Index("ix_trace_session", "session_id", "id"),
        Index("ix_trace_program", "program_id", "id"),
    )

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    program_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    worker_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    scopes: Mapped[str] = mapped_column(String(128))  # space-separated
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Who the token's requests are scheduled and rate-limited as; NULL: the token's id
    # (tokens made before tenants existed keep the per-token buckets they had).
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Response(Base):
    """A stored Responses API response (`store`, the default): what GET answers, and the
    conversation a later response continues by `previous_response_id`."""

    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    session_id: Mapped[str] = mapped_column(String(128))
    program_id: Mapped[str] = mapped_column(String(128))
    previous_response_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model: Mapped[str] = mapped_column(String(256))
    status: Mapped[str] = mapped_column(String(16))  # completed | incomplete
    # The chat messages so far, this response's reply last, without its instructions
    # (they do not carry over to the next response).
    conversation: Mapped[list[Any]] = mapped_column(JSON)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # the response object as answered
    created_at: Mapped[float] = mapped_column(Float)


class HistoryPoint(Base):
    """One value of one of the daemon's own series (daemon/history/): a raw sample
    (`step_s` 0) or a rollup of the finer tier over [ts, ts + step_s)."""

    __tablename__ = "history_points"
    __table_args__ = (Index("ix_history_step_ts", "step_s", "ts"),)

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    series: Mapped[str] = mapped_column(String(64))
    label: Mapped[str] = mapped_column(String(128), default="")  # a worker id, or ""
    step_s: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    value: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=1)  # raw samples folded in


class OperatorEvent(Base):
    """What an operator arriving after an incident needs to know happened: worker crashes,
    failovers, policy switches and rollbacks, refused and failed requests, expiries.
    Storms are folded into one row per kind, tenant and worker per interval (`count`)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_ts", "ts"), Index("ix_events_kind_ts", "kind", "ts"))

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float)  # the first occurrence
    last_ts: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))  # info | warning | error
    tenant: Mapped[str | None] = mapped_column(String(128), nullable=True)  # None: cluster
    worker_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    count: Mapped[int] = mapped_column(Integer, default=1)
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class RequestContent(Base):
    """What a request said and answered, for tenants that turn content tracing on
    (`content_tracing`; daemon/content/): its prompt as JSON (the chat messages, or the
    prompt text), its completion and its tool calls' arguments, each redacted and cut at
    `content_max_chars` before it is stored. Kept apart from `requests` so that the rows
    every request has stay small and a tenant without tracing costs nothing here."""

    __tablename__ = "request_contents"
    __table_args__ = (Index("ix_request_contents_session", "session_id"),)

    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id"), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(128))
    program_id: Mapped[str] = mapped_column(String(128))
    prompt: Mapped[Any] = mapped_column(JSON)  # {"messages": [...]} | {"prompt": "..."}
    completion: Mapped[str] = mapped_column(Text, default="")
    tool_calls: Mapped[list[Any]] = mapped_column(JSON, default=list)  # [{name, arguments}]
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)  # a field was cut
    redactions: Mapped[int] = mapped_column(Integer, default=0)  # matches replaced
    created_at: Mapped[float] = mapped_column(Float)
