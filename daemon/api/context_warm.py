"""Re-warming a snapshot on the worker where a program will use it.

A snapshot is only token ids; its KV is the engine's prefix cache, which vLLM evicts by LRU
and no hint can hold. So when a program opens a snapshot (`Context.open` with a program),
the daemon looks at the worker its next generate goes to (its home: the worker holding its
KV) and at what that worker's engine says is cached there, from its KV cache events
(daemon/kv/residency.py): the leading tokens cached of the last context of each program of
the snapshot's prefix group on that worker. When the snapshot's tokens are not all cached
there but for the last block (which the engine may never cache), the daemon fills them
there now, as the program's request, while the program goes on with its own work (a tool
call, text it appends); the program's next generate waits for that fill, so it starts on a
warm prefix instead of prefilling it in line.

No warm where nothing is known: a program without a home (its first generate places it),
and a worker whose engine publishes no KV events (the estimate knows token counts, not
which tokens), are left to the prefix cache as it is.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from litestar import Request

from daemon.api.gateway import until_finish
from daemon.core.core import Core
from daemon.core.dispatching import home
from daemon.state import ProgramState, WorkerState
from daemon.workers.protocol import SamplingParams

log = logging.getLogger("agentd.contexts")

_STATE_KEY = "agentd.snapshot_warms"


@dataclass(frozen=True)
class Warmth:
    """What opening a snapshot found on the program's worker, and whether it fills it."""

    worker_id: str | None
    cached_tokens: int | None  # None: unknown (no home, or no KV events from its engine)
    filling: bool

    def body(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "cached_tokens": self.cached_tokens,
                "filling": self.filling}


def cached_on(core: Core, group: str, tokens: int, worker: WorkerState) -> int | None:
    """Leading tokens of the snapshot `group` cached on `worker`, from its engine's events;
    None when they are not known."""
    if not core.kv.residency.use_events or not worker.kv_events:
        return None
    best = 0
    for program_id, report in worker.residency.items():
        program = core.programs.get(program_id)
        # A program of the group holds the snapshot's ids first: the cached lead of its
        # context, up to the snapshot's length, is the snapshot's.
        if program is not None and program.prefix_group == group:
            best = max(best, min(report.reachable_tokens, tokens))
    return best


def open_for(request: Request[Any, Any, Any], core: Core, program: ProgramState, name: str,
             group: str, model: str, token_ids: tuple[int, ...]) -> Warmth:
    """Start a fill of the snapshot on the program's home worker when it is cold there."""
    worker_id = home(program, core.workers)
    if worker_id is None:
        return Warmth(None, None, False)
    worker = core.workers[worker_id]
    cached = cached_on(core, group, len(token_ids), worker)
    warms = _warms(request)
    cold = cached is not None and cached < len(token_ids) - worker.block_size
    if not cold or program.id in warms or program.active_request is not None:
        return Warmth(worker_id, cached, False)
    task = asyncio.create_task(_fill(core, program, name, group, model, token_ids,
                                     worker_id, cached or 0),
                               name=f"warm-{program.id}")
    warms[program.id] = task
    task.add_done_callback(lambda _t: warms.pop(program.id, None))
    return Warmth(worker_id, cached, True)


async def settled(request: Request[Any, Any, Any], program_id: str | None) -> None:
    """Wait for the program's snapshot fill, if one runs: a program makes one LLM call at a
    time, and its generate is what the fill warms for. The fill's failure is the fill's
    (traced): the generate goes on, prefilling what the fill did not."""
    task = _warms(request).get(program_id or "")
    if task is not None:
        await asyncio.wait([task])


async def _fill(core: Core, program: ProgramState, name: str, group: str, model: str,
                token_ids: tuple[int, ...], worker_id: str, cached_before: int) -> None:
    program.prefix_group, program.prefix_tokens = group, len(token_ids)
    fields: dict[str, Any] = {"name": name, "tokens": len(token_ids),
                              "cached_before": cached_before}
    try:
        req = core.submit(program, "context", model, SamplingParams(max_tokens=1),
                          prompt_token_ids=list(token_ids))
        _, finish = await until_finish(core, req, program.id, False)
        fields |= {"request_id": req.id, "worker_id": req.worker_id,
                   "cached_tokens": finish.cached_tokens}
    except Exception as exc:  # a failed warm costs the generate only a prefill
        log.warning("warming snapshot %r for program %s failed: %s", name, program.id, exc)
        fields |= {"worker_id": worker_id, "error": str(exc)}
    core.writer.trace("context.warm", session_id=program.session_id, program_id=program.id,
                      **fields)


def _warms(request: Request[Any, Any, Any]) -> dict[str, asyncio.Task[None]]:
    warms = request.app.state.get(_STATE_KEY)
    if warms is None:
        warms = request.app.state[_STATE_KEY] = {}
    return warms
