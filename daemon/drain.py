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

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Request, Response, post

from daemon.api.errors import ApiError, decode_body, error_body
from daemon.auth import OPERATOR
from daemon.core import Core
from daemon.protocol import Finish
from daemon.state import RequestState, RequestStatus

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


def add_stop_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("stop", help="stop a running daemon (--drain: gracefully)")
    p.add_argument("--drain", action="store_true",
                   help="stop admission, let running requests finish, then stop")
    p.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S,
                   help="drain: seconds running requests get before they are aborted")
    p.add_argument("--data-dir", help="the daemon's data dir (its daemon.pid is read)")
    p.add_argument("--url", help="the daemon's base URL (default: from daemon.pid)")
    p.add_argument("--token", help="operator token (default: $AGENTD_TOKEN or the token file)")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for the exit (after the deadline when draining)")
    p.set_defaults(func=cmd_stop)


def cmd_stop(args: argparse.Namespace) -> int:
    from daemon import config as config_mod

    cfg = config_mod.load({"data_dir": args.data_dir}, config_file=args.config)
    pid, url = _read_pid_file(cfg.data_path / PID_FILE)
    url = args.url or url or cfg.base_url
    if args.drain:
        _post_drain(url, _token(args, cfg.config_path), args.deadline)
        wait_s = args.deadline + args.timeout
    elif pid is None:
        return _fail(f"no running daemon found ({cfg.data_path / PID_FILE} is missing or "
                     "stale); with only --url, use --drain")
    else:
        os.kill(pid, signal.SIGTERM)
        wait_s = args.timeout
    if not _wait_gone(pid, url, wait_s):
        return _fail(f"the daemon did not exit within {wait_s:.0f}s")
    print(f"agentd: daemon {pid or url} {'drained and ' if args.drain else ''}stopped")
    return 0


def _read_pid_file(path: Path) -> tuple[int | None, str | None]:
    try:
        lines = path.read_text().split()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None, None
    if not _alive(pid):
        return None, None
    return pid, lines[1] if len(lines) > 1 else None


def _token(args: argparse.Namespace, config_path: Path) -> str | None:
    if args.token:
        return str(args.token)
    if os.environ.get("AGENTD_TOKEN"):
        return os.environ["AGENTD_TOKEN"]
    with contextlib.suppress(OSError):
        return (config_path / "token").read_text().strip()
    return None


def _post_drain(url: str, token: str | None, deadline: float) -> None:
    import httpx

    from daemon.cli import CliError

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.post(f"{url.rstrip('/')}/v1/admin/drain", json={"deadline_s": deadline},
                       headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the daemon at {url}: {exc}") from exc
    if r.status_code != 202:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:200]
        raise CliError(f"drain refused ({r.status_code}): {message}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie has exited: only its parent must reap it
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def _wait_gone(pid: int | None, url: str, wait_s: float) -> bool:
    import httpx

    until = time.time() + wait_s
    while time.time() < until:
        if pid is not None:
            if not _alive(pid):
                return True
        else:
            try:
                httpx.get(f"{url.rstrip('/')}/healthz", timeout=1)
            except httpx.HTTPError:
                return True
        time.sleep(0.1)
    return False


def _fail(message: str) -> int:
    print(f"agentd: {message}", file=sys.stderr)
    return 1

