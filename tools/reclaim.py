"""Reclaiming tool resources: at program release, and by reconciliation after a crash.

Reconciliation trusts only labels and the daemon's idea of which programs are live, so it
works the same whether the daemon restarted, a release was lost, or an operator asks
`agentctl tools gc --dry-run` what would go.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any

from tools.base import Backend, Resource
from tools.errors import Reason, ToolError

log = logging.getLogger(__name__)

EventSink = Callable[[dict[str, Any]], None]
LivePrograms = Callable[[], Awaitable[Collection[str]] | Collection[str]]

# A container holds its volumes; removing it first lets the volumes go.
_ORDER = {"container": 0, "volume": 1, "dir": 2}


def emit(sink: EventSink | None, kind: str, **fields: Any) -> None:
    """A broken event consumer must never break the tool it is watching."""
    if sink is None:
        return
    try:
        sink({"kind": kind, "at": time.time(), **fields})
    except Exception:
        log.exception("tool event consumer failed on %s", kind)


async def reclaim(
    backend: Backend, resources: Iterable[Resource], sink: EventSink | None, why: str
) -> list[dict[str, Any]]:
    """Remove each resource, emitting one `tool.release` per thing; failures are reported in
    the result (and left for the next reconciliation), never raised."""
    done = []
    for res in sorted(resources, key=lambda r: _ORDER[r.kind]):
        outcome: dict[str, Any] = res.to_dict() | {"ok": True, "error": None, "why": why}
        try:
            await backend.reclaim(res)
        except ToolError as exc:
            outcome |= {"ok": False, "error": exc.to_dict()}
        emit(sink, "tool.release", **outcome)
        done.append(outcome)
    return done


async def find_orphans(
    daemon_id: str, backends: Sequence[Backend], live_programs: LivePrograms
) -> list[tuple[Backend, Resource]]:
    """Labelled resources of this daemon whose program is not live (STOPPED or unknown).

    Resources are listed *before* asking which programs are live: a program registered in
    between then cannot have its brand-new container mistaken for an orphan."""
    found = [(b, r) for b in backends for r in await _resources_or_none(b, daemon_id)]
    answer = live_programs()
    live = set(await answer if inspect.isawaitable(answer) else answer)
    return [(b, r) for b, r in found if r.owner.program_id not in live]


async def _resources_or_none(backend: Backend, daemon_id: str) -> list[Resource]:
    """An engine that is down holds nothing we can reclaim now; the next sweep retries."""
    try:
        return list(await backend.resources(daemon_id))
    except ToolError as exc:
        if exc.reason != Reason.ENGINE_DOWN:
            raise
        log.warning("skipping %s in reconciliation: %s", type(backend).__name__, exc)
        return []


async def reconcile(
    daemon_id: str,
    backends: Sequence[Backend],
    live_programs: LivePrograms,
    *,
    dry_run: bool = False,
    on_event: EventSink | None = None,
) -> list[dict[str, Any]]:
    """Reclaim (or, with `dry_run`, only list) what belongs to no live program of this daemon.
    Other daemons' resources are never touched: their labels name another daemon id."""
    orphans = await find_orphans(daemon_id, backends, live_programs)
    if dry_run:
        return [r.to_dict() | {"ok": None, "error": None, "why": "gc"} for _, r in orphans]
    results = []
    for backend in backends:
        mine = [r for b, r in orphans if b is backend]
        results += await reclaim(backend, mine, on_event, "gc")
    return results
