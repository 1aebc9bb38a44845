"""`agentctl`: inspect and steer a running agentd daemon through its public REST API.

Exit codes: 0 ok, 1 the daemon failed or could not be reached (one line on
stderr, never a traceback), 2 usage errors (argparse's own convention).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from console import render
from console.client import DEFAULT_TIMEOUT_S, AgentdClient, ClientError, api, metric_sums
from console.client import trace_pages as _trace_pages
from console.policy_cmd import add_policy_parser
from console.tui import add_tui_parser
from console.workflow_cmd import add_workflow_parser

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
TOKEN_HINT = ("agentctl sends --token, else $AGENTD_TOKEN, else the file "
              "$XDG_CONFIG_HOME/agentd/token, default ~/.config/agentd/token")

Command = Callable[[AgentdClient, argparse.Namespace], int]


def _out(text: str) -> None:
    print(text, flush=True)


def _dump(payload: Any) -> None:
    _out(json.dumps(payload, indent=2, ensure_ascii=False))


# --- commands -----------------------------------------------------------------------


def cmd_status(c: AgentdClient, a: argparse.Namespace) -> int:
    health = c.call(api.healthz())
    workers = c.call(api.workers())["data"]
    counts = {s: int(c.call(api.programs(status=s, limit=1))["total"])
              for s in render.PROGRAM_STATUSES}
    metrics = metric_sums(c.call(api.metrics()))
    if a.json:
        _dump({"url": c.url, "health": health, "workers": workers,
               "programs_by_status": counts, "metrics": metrics})
    else:
        _out(render.status_view(c.url, health, workers, counts, metrics))
    if health.get("status") != "ok":
        raise ClientError(f"the daemon is {health.get('status')}: "
                          f"{health.get('store_error') or 'see its log'}")
    return EXIT_OK


def cmd_workers(c: AgentdClient, a: argparse.Namespace) -> int:
    answer = c.call(api.workers())
    if a.json:
        _dump(answer)
    else:
        _out(render.workers_table(answer["data"]))
    return EXIT_OK


def cmd_programs(c: AgentdClient, a: argparse.Namespace) -> int:
    answer = c.call(api.programs(a.status, a.session, a.limit))
    if a.json:
        _dump(answer)
    else:
        _out(render.programs_table(answer["data"], answer["total"]))
    return EXIT_OK


def cmd_program(c: AgentdClient, a: argparse.Namespace) -> int:
    answer = c.call(api.program(a.program_id))
    if a.json:
        _dump(answer)
    else:
        _out(render.program_view(answer))
    return EXIT_OK


def cmd_release(c: AgentdClient, a: argparse.Namespace) -> int:
    answer = c.call(api.release(a.program_id))
    if a.json:
        _dump(answer)
    else:
        _out(f"released {answer['id']} (now {answer['status']})")
    return EXIT_OK


def cmd_release_idle(c: AgentdClient, a: argparse.Namespace) -> int:
    """Without --yes only lists what would be released: the confirmation a script can give."""
    answer = c.call(api.release_idle(a.idle, dry_run=not a.yes, tenant=a.tenant))
    if a.json:
        _dump(answer)
        return EXIT_OK
    for p in answer["data"]:
        _out(f"{p['id']:32} tenant {p['tenant']:12} idle {p['idle_s']:.0f} s")
    found = len(answer["data"])
    if a.yes:
        _out(f"released {answer['released']} program(s) idle for {a.idle:g} s or more")
    elif found:
        _out(f"{found} program(s) idle for {a.idle:g} s or more; "
             "run again with --yes to release them")
    else:
        _out(f"no program idle for {a.idle:g} s or more")
    return EXIT_OK


def cmd_action(c: AgentdClient, a: argparse.Namespace) -> int:
    answer = c.call(api.program_action(a.command, a.program_id))
    if a.json:
        _dump(answer)
    else:
        _out(f"{a.command}: {answer['id']} is now {answer['status']}")
    return EXIT_OK


def cmd_migrate(c: AgentdClient, a: argparse.Namespace) -> int:
    kind = "session" if a.session else "program"
    answer = c.call(api.migrate(kind, a.ident, a.worker, a.now))
    if a.json:
        _dump(answer)
        return EXIT_OK
    for move in answer["data"]:
        when = "after its running request" if move["deferred"] else "now"
        _out(f"{move['program_id']}: {move['from'] or '-'} -> {move['to']} ({when}; "
             f"{move['recompute_tokens']} tokens to recompute)")
    return EXIT_OK


def cmd_tools(c: AgentdClient, a: argparse.Namespace) -> int:
    if a.tools_action == "gc":
        answer = c.call(api.tools_gc(dry_run=a.dry_run))
        rows = answer["data"]
        verb = "would reclaim" if a.dry_run else "reclaimed"
    else:
        answer = c.call(api.tools())
        rows = answer["data"]
        verb = ""
    if a.json:
        _dump(answer)
        return EXIT_OK
    if verb:
        _out(f"{verb} {len(rows)} resource(s)")
    for host, message in sorted((answer.get("hosts_down") or {}).items()):
        _out(f"skipped Docker engine {host} (does not answer; retried at the next sweep): "
             f"{message}")
    for r in rows:
        _out(f"{r.get('backend', '-'):8} {r.get('resource', '-'):10} {r.get('program_id', '-'):24} "
             f"{r.get('tool', '-'):12} {r.get('state', '-'):10} {r.get('disk_bytes') or 0:>10}B")
    return EXIT_OK


def cmd_sessions(c: AgentdClient, a: argparse.Namespace) -> int:
    answer = c.call(api.sessions(a.limit))
    if a.json:
        _dump(answer)
    else:
        _out(render.sessions_table(answer["data"], answer["total"]))
    return EXIT_OK


def cmd_trace(c: AgentdClient, a: argparse.Namespace) -> int:
    if a.json:
        events = [e for page in _trace_pages(c, a.session_id) for e in page]
        _dump({"session_id": a.session_id, "data": events})
        return EXIT_OK
    timeline = render.Timeline()
    count = 0
    # printed page by page, so a long trace starts showing before it is all fetched
    for page in _trace_pages(c, a.session_id):
        for event in page:
            if count == 0:
                _out(render.TRACE_HEADER)
            _out(timeline.line(event))
            count += 1
    if count == 0:
        _out(f"session {a.session_id} has no trace events yet")
    return EXIT_OK


def _first_model(c: AgentdClient) -> str:
    models = c.call(api.models())["data"]
    if not models:
        raise ClientError("the daemon serves no model yet (no healthy worker); "
                          "check `agentctl workers`")
    return str(models[0]["id"])


def cmd_chat(c: AgentdClient, a: argparse.Namespace) -> int:
    model = a.model or _first_model(c)
    call = api.chat(model, [{"role": "user", "content": a.prompt}], a.max_tokens,
                    a.program, a.session, stream=a.stream)
    if a.stream:
        return _chat_stream(c, call, a.json)
    answer = c.call(call)
    if a.json:
        _dump(answer)
        return EXIT_OK
    choice = answer["choices"][0]
    _out(choice["message"]["content"] or "")
    _note(_chat_summary(answer["program_id"], answer["session_id"], model,
                        answer.get("usage"), choice.get("finish_reason")))
    return EXIT_OK


def _chat_stream(c: AgentdClient, call: Any, as_json: bool) -> int:
    usage: dict[str, Any] | None = None
    finish: str | None = None
    with c.stream(call) as stream:
        for event in stream.events():
            if as_json:
                print(json.dumps(event, ensure_ascii=False), flush=True)
                continue
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                print(choice.get("delta", {}).get("content") or "", end="", flush=True)
                finish = choice.get("finish_reason") or finish
        headers = stream.headers
    if not as_json:
        print(flush=True)
        _note(_chat_summary(headers.get("x-program-id"), headers.get("x-session-id"),
                            str(call.body["model"]), usage, finish))
    return EXIT_OK


def _chat_summary(program: str | None, session: str | None, model: str,
                  usage: dict[str, Any] | None, finish: str | None) -> str:
    tokens = "-"
    if usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        tokens = (f"{usage['prompt_tokens']} prompt ({cached} cached) + "
                  f"{usage['completion_tokens']} output")
    return f"[program {program}  session {session}  model {model}  tokens {tokens}  " \
           f"finish {finish or '-'}]"


def _note(text: str) -> None:
    # metadata goes to stderr so that stdout holds only the model's text
    print(text, file=sys.stderr, flush=True)


# --- parsing ------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """--url/--token/--json/--timeout, accepted before or after the command name."""
    def default(value: Any) -> Any:
        # a subcommand's own default would overwrite a value given before the command
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--url", default=default(None),
                        help="daemon URL (default: $AGENTD_URL or http://127.0.0.1:8420)")
    parser.add_argument("--token", default=default(None),
                        help="API token (default: $AGENTD_TOKEN or ~/.config/agentd/token)")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print the daemon's raw JSON")
    parser.add_argument("--timeout", type=float, default=default(DEFAULT_TIMEOUT_S),
                        metavar="SECONDS", help=f"network timeout (default: {DEFAULT_TIMEOUT_S:g})")


_COMMANDS: dict[str, tuple[Command, str]] = {
    "status": (cmd_status, "daemon health, workers and programs by status"),
    "workers": (cmd_workers, "engine workers and their live stats"),
    "programs": (cmd_programs, "programs, newest first"),
    "program": (cmd_program, "one program with its requests"),
    "release": (cmd_release, "end a program and release its resources"),
    "release-idle": (cmd_release_idle, "end every program idle for a while (lists them "
                     "without --yes)"),
    "sessions": (cmd_sessions, "sessions, newest first"),
    "trace": (cmd_trace, "a session's trace as a readable timeline"),
    "chat": (cmd_chat, "one chat completion round trip"),
    "pause": (cmd_action, "operator: pause a program until resumed"),
    "resume": (cmd_action, "operator: let the scheduler restore a paused program"),
    "kill": (cmd_action, "operator: abort a program's request and end it"),
    "migrate": (cmd_migrate, "operator: move a program or session to a worker"),
    "tools": (cmd_tools, "tool environments: list, or gc [--dry-run]"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentctl", description=__doc__.splitlines()[0])
    _common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subs = {name: sub.add_parser(name, help=text, description=text)
            for name, (_, text) in _COMMANDS.items()}
    for p in subs.values():
        _common(p, suppress=True)
    subs["programs"].add_argument("--status", type=str.upper, choices=render.PROGRAM_STATUSES)
    subs["programs"].add_argument("--session", help="only this session's programs")
    subs["programs"].add_argument("--limit", type=_positive, default=50)
    subs["program"].add_argument("program_id", metavar="ID")
    for action in ("release", "pause", "resume", "kill"):
        subs[action].add_argument("program_id", metavar="ID")
    idle = subs["release-idle"]
    idle.add_argument("--idle", type=_seconds, default=600.0, metavar="SECONDS",
                      help="quiet for at least this long (default: 600)")
    idle.add_argument("--yes", action="store_true", help="release them (else: only list)")
    idle.add_argument("--tenant", help="operator: only this tenant's programs")
    subs["migrate"].add_argument("ident", metavar="ID", help="program id (or session id)")
    subs["migrate"].add_argument("worker", metavar="WORKER", help="target worker id")
    subs["migrate"].add_argument("--session", action="store_true", help="ID is a session")
    subs["migrate"].add_argument("--now", action="store_true",
                                 help="abort a running request and continue it on the target")
    subs["tools"].add_argument("tools_action", nargs="?", choices=["list", "gc"], default="list")
    subs["tools"].add_argument("--dry-run", action="store_true", help="gc: only list")
    subs["sessions"].add_argument("--limit", type=_positive, default=50)
    subs["trace"].add_argument("session_id", metavar="SESSION")
    chat = subs["chat"]
    chat.add_argument("prompt")
    chat.add_argument("--model", help="default: the first model in /v1/models")
    chat.add_argument("--max-tokens", type=_positive, default=None)
    chat.add_argument("--program", help="program id, to make this a step of that program")
    chat.add_argument("--session", help="session id for a new program")
    chat.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    add_tui_parser(sub, lambda p: _common(p, suppress=True))
    add_policy_parser(sub, lambda p: _common(p, suppress=True))
    add_workflow_parser(sub, lambda p: _common(p, suppress=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = (getattr(args, "tui_command", None) or getattr(args, "policy_command", None)
               or _COMMANDS[args.command][0])
    try:
        with AgentdClient(args.url, args.token, args.timeout) as client:
            return command(client, args)
    except ClientError as exc:
        hint = f" ({TOKEN_HINT})" if exc.status == 401 else ""
        print(f"agentctl: {exc.message}{hint}", file=sys.stderr)
        return EXIT_FAILURE
    except (KeyError, TypeError, IndexError) as exc:
        # a payload that does not have the documented shape: a version mismatch, not a
        # crash to show the user a traceback for
        print(f"agentctl: unexpected answer from the daemon ({type(exc).__name__}: {exc}); "
              "are agentctl and agentd the same version?", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader (`| head`) went away; silence the interpreter's own flush error too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
