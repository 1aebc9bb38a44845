"""`agentctl submit DIR --entry MODULE:FUNC --args JSON [--session S] [--tools FILE] [--follow]`
and `agentctl stubgen AGENT.yaml [-o OUT.py] [--check]`.

submit registers DIR's text files as a new version of the workflow (named after DIR
unless --name), starts a run, and prints the run; with --follow it streams the run's
events and then prints its result (exit 1 when the run failed). The bundle's tool specs
come from --tools, or DIR/tools.toml when there is one: `[tools.NAME]` tables, the same
schema as the daemon config's; the daemon checks them and names a bad field.

stubgen turns an agent's YAML declaration into its stub module (agentd/stubgen.py),
written next to the YAML as <agent>.py unless -o; --check only says whether the file on
disk is up to date (exit 1 if not). It needs no daemon.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentd.stubgen import StubgenError, generate
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


def read_tools(path: Path) -> dict[str, Any]:
    """The `[tools.NAME]` tables of a TOML file, unchecked: the daemon checks them."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClientError(f"{path}: not TOML: {exc}") from None
    tools = data.get("tools")
    if not isinstance(tools, dict) or not tools or set(data) != {"tools"}:
        raise ClientError(f"{path}: expected only [tools.NAME] tables")
    return tools


def _entry(text: str) -> str:
    return text if ":" in text else f"main:{text}"


def cmd_submit(c: AgentdClient, a: argparse.Namespace) -> int:
    root = Path(a.dir)
    name = a.name or root.resolve().name
    files = read_bundle(root)
    upload: dict[str, Any] = {"name": name, "files": files, "entry": a.entry}
    tools_file = Path(a.tools) if a.tools else root / "tools.toml"
    if a.tools or tools_file.is_file():
        upload["tools"] = read_tools(tools_file)
        if not a.tools:
            files.pop("tools.toml", None)  # sent as specs, not as a file of the bundle
    manifest = c.call(Call("POST", "/v1/workflows", body=upload))
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


def cmd_stubgen(_c: AgentdClient, a: argparse.Namespace) -> int:
    src = Path(a.yaml)
    try:
        text = src.read_text()
    except OSError as exc:
        raise ClientError(f"cannot read {src}: {exc.strerror or exc}") from None
    try:
        name, module = generate(text, src.name)
    except StubgenError as exc:
        raise ClientError(f"{src}: {exc}") from None
    out = Path(a.output) if a.output else src.with_name(f"{name}.py")
    if a.check:
        current = out.read_text() if out.is_file() else None
        if current != module:
            print(f"{out} is not up to date with {src}; run agentctl stubgen {src}",
                  file=sys.stderr)
            _say(a, {"stub": str(out), "agent": name, "up_to_date": False}, None)
            return 1
        _say(a, {"stub": str(out), "agent": name, "up_to_date": True}, f"{out} is up to date")
        return 0
    try:
        out.write_text(module)
    except OSError as exc:
        raise ClientError(f"cannot write {out}: {exc.strerror or exc}") from None
    _say(a, {"stub": str(out), "agent": name, "written": True}, f"wrote {out} (agent {name})")
    return 0


def _say(a: argparse.Namespace, payload: dict[str, Any], text: str | None) -> None:
    """`payload` as JSON with --json, else `text` (if any)."""
    if getattr(a, "json", False):
        print(json.dumps(payload), flush=True)
    elif text is not None:
        print(text, flush=True)


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
    p.add_argument("--tools", metavar="FILE",
                   help="TOML of [tools.NAME] specs for the bundle (default: DIR/tools.toml)")
    p.add_argument("--follow", action="store_true",
                   help="stream the run's events, then print its result")
    p.set_defaults(tui_command=cmd_submit)
    if common is not None:
        common(p)
    g = subparsers.add_parser("stubgen", help="generate an agent's stub module from its YAML",
                              description="turn an agent's YAML declaration (name, class, "
                              "functions, parameters, directives) into an importable stub")
    g.add_argument("yaml", metavar="AGENT.yaml")
    g.add_argument("-o", "--output", metavar="OUT.py", help="default: <agent>.py beside the YAML")
    g.add_argument("--check", action="store_true",
                   help="exit 1 if the stub on disk differs from what would be generated")
    g.set_defaults(tui_command=cmd_stubgen)
    if common is not None:
        common(g)
