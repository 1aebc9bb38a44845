"""`agentd stop [--drain]`: find the daemon by its pid file and stop it (the drain itself is
daemon/api/drain.py)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from daemon.api.drain import DEFAULT_DEADLINE_S, PID_FILE
from daemon.commands.errors import CliError

log = logging.getLogger("agentd.drain")


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

