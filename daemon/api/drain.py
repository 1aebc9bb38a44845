"""Graceful drain: `agentd stop --drain` and the `POST /v1/admin/drain` it calls.

A drain stops admission (new gateway requests and new workflow runs get 503 with
Retry-After), lets the requests already queued or running finish until a deadline, aborts
the rest with a reason that says so, flushes the store and then stops the daemon the way
SIGTERM does, so it exits 0 (runs still live then are cancelled, as on SIGTERM). SIGTERM
alone stays a fast clean stop.

The daemon writes `daemon.pid` in its data dir at start: the PID on the first line,
its base URL on the second. `agentd stop` reads it to find the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Request, Response, post

from daemon.access.auth import OPERATOR
from daemon.api.errors import decode_body, error_body
from daemon.core.core import Core
from daemon.errors import ApiError
from daemon.state import RequestState, RequestStatus
from daemon.workers.protocol import Finish

log = logging.getLogger("agentd.drain")

PID_FILE = "daemon.pid"
DEFAULT_DEADLINE_S = 30.0
RETRY_AFTER_S = 5
# The routes that admit new work, as (method, path); everything else (reads such as
# GET /v1/runs, release, cancel, the drain) still works.
ADMISSION_ROUTES = frozenset({("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                              ("POST", "/v1/runs")})
_SEND_GRACE_S = 0.05


# --- in the daemon ------------------------------------------------------------------


def write_pid_file(data_path: Path, base_url: str) -> Path:
    path = data_path / PID_FILE
    path.write_text(f"{os.getpid()}\n{base_url}\n")
    return path


def remove_pid_file(path: Path) -> None:
    """Remove the PID file if it is still ours (a newer daemon may have replaced it)."""
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().split()[0]) == os.getpid():
            path.unlink()


@dataclass
class DrainState:
    started_at: float
    deadline_at: float
    task: asyncio.Task[None] | None = None


class DrainBody(msgspec.Struct, forbid_unknown_fields=True):
    deadline_s: float = DEFAULT_DEADLINE_S


def _state(request: Request[Any, Any, Any]) -> DrainState | None:
    value = request.app.state.get("drain")
    return value if isinstance(value, DrainState) else None


async def refuse_while_draining(request: Request[Any, Any, Any]) -> Response[Any] | None:
    """App-level before_request hook: while draining, new gateway requests and runs get
    503."""
    drain = _state(request)
    if drain is None or (request.method, request.scope["path"]) not in ADMISSION_ROUTES:
        return None
    left = max(0.0, drain.deadline_at - time.time())
    message = (f"the daemon is draining for shutdown and admits no new requests or runs "
               f"(running ones finish within {left:.0f}s); retry on another instance or "
               "after it restarts")
    return Response(error_body(503, message, "draining"), status_code=503,
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class DrainController(Controller):
    path = "/v1/admin"
    tags = ["ops"]

    @post("/drain", status_code=202, opt={"scope": OPERATOR},
          summary="Stop admission, finish running requests until the deadline, then stop")
    async def drain(self, request: Request[Any, Any, Any], core: Core) -> dict[str, Any]:
        raw = await request.body()
        body = decode_body(raw, DrainBody) if raw.strip() else DrainBody()
        if not 0 <= body.deadline_s <= 86400:
            raise ApiError(400, "deadline_s must be between 0 and 86400 seconds",
                           param="deadline_s")
        drain = _state(request)
        if drain is None:
            now = time.time()
            drain = DrainState(started_at=now, deadline_at=now + body.deadline_s)
            request.app.state["drain"] = drain
            drain.task = asyncio.create_task(_drain(core, drain), name="drain")
            core.writer.trace("daemon.draining", deadline_s=body.deadline_s,
                              in_flight=len(in_flight(core)))
            log.info("draining: %d requests in flight, deadline %.0fs",
                     len(in_flight(core)), body.deadline_s)
        return {"draining": True, "pid": os.getpid(), "in_flight": len(in_flight(core)),
                "deadline_at": drain.deadline_at}


def in_flight(core: Core) -> list[str]:
    live = (RequestStatus.QUEUED, RequestStatus.RUNNING)
    return [r.id for r in core.requests.values() if r.status in live]


async def _until_idle(core: Core, timeout: float) -> None:
    """Until no request is queued or running (the core ends every request through
    `on_request_end`), or `timeout` has passed."""
    idle = asyncio.Event()

    def ended(_req: RequestState, _finish: Finish | None) -> None:
        if not in_flight(core):
            idle.set()

    core.on_request_end.append(ended)
    try:
        if in_flight(core):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(idle.wait(), max(0.0, timeout))
    finally:
        core.on_request_end.remove(ended)


async def _drain(core: Core, drain: DrainState) -> None:
    await _until_idle(core, drain.deadline_at - time.time())
    left = in_flight(core)
    deadline = drain.deadline_at - drain.started_at
    for request_id in left:
        await core.abort(request_id, reason=f"aborted: the daemon is shutting down and its "
                                            f"drain deadline of {deadline:.0f}s passed")
    core.writer.trace("daemon.drained", aborted=len(left),
                      seconds=round(time.time() - drain.started_at, 3))
    await core.writer.flush()
    await asyncio.sleep(_SEND_GRACE_S)  # let the last responses and stream ends go out
    log.info("drained (%d aborted at the deadline); stopping", len(left))
    os.kill(os.getpid(), signal.SIGTERM)


# --- agentd stop ----------------------------------------------------------------------
