"""`agentctl submit DIR --entry MODULE:FUNC --args JSON [--session S] [--follow]`.

Registers DIR's text files as a new version of the workflow (named after DIR unless
--name), starts a run, and prints the run; with --follow it streams the run's events
and then prints its result (exit 1 when the run failed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from console.client import AgentdClient, Call, ClientError

SKIP_DIRS = {"__pycache__", ".git", ".venv", "node_modules"}
MAX_FILE_BYTES = 512 * 1024


def read_bundle(root: Path) -> dict[str, str]:
    if not root.is_dir():
        raise ClientError(f"{root} is not a directory")
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith(".") for part in rel.parts):
            continue
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            files[rel.as_posix()] = path.read_text()
        except UnicodeDecodeError:
            continue  # bundles carry text only
    if not files:
        raise ClientError(f"{root} holds no text files to submit")
    return files


def _args(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--args is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--args must be a JSON object of argument names")
    return value


def _entry(text: str) -> str:
    return text if ":" in text else f"main:{text}"


def cmd_submit(c: AgentdClient, a: argparse.Namespace) -> int:
    root = Path(a.dir)
    name = a.name or root.resolve().name
    manifest = c.call(Call("POST", "/v1/workflows",
                           body={"name": name, "files": read_bundle(root), "entry": a.entry}))
    body: dict[str, Any] = {"workflow": name, "version": manifest["version"], "args": a.args}
    if a.session:
        body["session_id"] = a.session
    run = c.call(Call("POST", "/v1/runs", body=body))
    if not a.follow:
        print(json.dumps(run, indent=2) if a.json else
              f"run {run['id']} of {name} v{manifest['version']} "
              f"(program {run['program_id']}, session {run['session_id']})", flush=True)
        return 0
    with c.stream(Call("GET", f"/v1/runs/{run['id']}/events", generation=True)) as stream:
        for event in stream.events():
            if not a.json:
                extra = {k: v for k, v in event.items()
                         if k not in ("kind", "ts", "run_id", "session_id", "program_id")}
                print(f"{time.strftime('%H:%M:%S', time.localtime(event['ts']))} "
                      f"{event['kind']:<16} {json.dumps(extra)[:160]}", file=sys.stderr,
                      flush=True)
    final = c.call(Call("GET", f"/v1/runs/{run['id']}"))
    if a.json:
        print(json.dumps(final, indent=2), flush=True)
    elif final["status"] == "finished":
        print(json.dumps(final["result"], indent=2), flush=True)
    else:
        err = final.get("error") or {}
        print(f"run {final['id']} {final['status']}: {err.get('reason')}", file=sys.stderr)
        if err.get("traceback"):
            print(err["traceback"], file=sys.stderr)
    return 0 if final["status"] == "finished" else 1


def add_workflow_parser(subparsers: Any,
                        common: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """Add `submit` to agentctl's subparsers; `common` adds the shared flags."""
    p = subparsers.add_parser("submit", help="register a workflow directory and run it",
                              description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("dir", metavar="DIR", help="the workflow's directory")
    p.add_argument("--entry", type=_entry, default="main:main",
                   help="MODULE:FUNCTION, or FUNCTION in main.py (default: main:main)")
    p.add_argument("--args", type=_args, default={}, metavar="JSON",
                   help="the entry's arguments as a JSON object")
    p.add_argument("--session", help="session id (managed state lives there)")
    p.add_argument("--name", help="workflow name (default: the directory's name)")
    p.add_argument("--follow", action="store_true",
                   help="stream the run's events, then print its result")
    p.set_defaults(tui_command=cmd_submit)
    if common is not None:
        common(p)
