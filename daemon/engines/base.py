"""The interface every engine implements; the worker runtime drives it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from daemon.workers.protocol import (
    Finish,
    ProgramResidency,
    Submit,
    TokenDelta,
    ToolSupport,
    WorkerStats,
)


class Engine(Protocol):
    """One inference engine inside a worker process.

    `start` is awaited once before registration. `generate` is called once per
    submitted request; it yields token deltas and ends with exactly one Finish
    (also when aborted or failed: reason "abort" / "error"). `stats` and
    `residency_report` are called for every heartbeat and must not block.

    An engine that publishes KV cache events (`kv_events`) reports from them which of each
    program's context is still cached (daemon/engines/kv_events.py): what changed since the
    last report, or everything it tracks, and the programs it no longer tracks.
    """

    engine: str  # "vllm" | "sim"
    model: str
    kv_capacity_tokens: int
    block_size: int
    max_batch: int
    tools: ToolSupport  # read at registration, after `start`
    kv_events: bool  # read at registration, after `start`

    async def start(self) -> None: ...

    def generate(self, submit: Submit) -> AsyncIterator[TokenDelta | Finish]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> WorkerStats: ...

    @property
    def dead(self) -> bool:
        """The engine can serve nothing more (its core process died): the worker exits, so
        its supervisor starts a new one and the daemon fails its requests over."""
        ...

    def residency_report(self, everything: bool
                         ) -> tuple[dict[str, ProgramResidency], list[str]]: ...

    async def shutdown(self) -> None: ...
