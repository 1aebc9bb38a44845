"""`agentctl tui` (interactive) and `agentctl top` (one text screen), wired by agentctl.

`add_tui_parser(subparsers)` adds both subcommands; each sets `tui_command`, a
function with agentctl's command signature `(AgentdClient, Namespace) -> int`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from console import render
from console.client import AgentdClient, AsyncAgentdClient, api
from console.tui.alerts import DEFAULT_KV_IMBALANCE, imbalance_alert, worker_alerts

EXIT_OK = 0
DEFAULT_IDLE_RELEASE_S = 600.0  # the programs view's bulk release (key i)
TOP_PROGRAMS = 15


def top_data(c: AgentdClient) -> dict[str, Any]:
    """What the `top` screen shows, as data (`agentctl top --json`)."""
    workers = c.call(api.workers())["data"]
    programs = c.call(api.programs(limit=TOP_PROGRAMS))
    alerts = [*worker_alerts(workers), imbalance_alert(workers, DEFAULT_KV_IMBALANCE)]
    return {
        "url": c.url, "health": c.call(api.healthz()), "workers": workers,
        "programs_by_status": {s: int(c.call(api.programs(status=s, limit=1))["total"])
                               for s in render.PROGRAM_STATUSES},
        "active_policies": [{"layer": p["layer"], "name": p["name"],
                             "version": p["active_version"]}
                            for p in c.call(api.policies())["data"] if p.get("active")],
        "alerts": [{"severity": a.severity, "text": a.text} for a in alerts if a is not None],
        "programs": programs["data"], "programs_total": programs["total"],
    }


def top_text(data: dict[str, Any]) -> str:
    """The `top` screen: status, policies, alerts, workers and the newest programs."""
    active = [f"{p['layer']}: {p['name']} v{p['version']}" for p in data["active_policies"]]
    lines = [f"alert: {a['text']}" for a in data["alerts"]] or ["alerts: none"]
    return "\n\n".join([
        render.status_view(data["url"], data["health"], data["workers"],
                           data["programs_by_status"], {}),
        "\n".join([f"active policies: {'   '.join(active) or 'none'}", *lines]),
        render.workers_table(data["workers"]),
        render.programs_table(data["programs"], data["programs_total"]),
    ])


def cmd_top(c: AgentdClient, a: argparse.Namespace) -> int:
    """--json prints one JSON object per refresh (one line each without --once)."""
    def show(clear: bool) -> None:
        data = top_data(c)
        if getattr(a, "json", False):
            print(json.dumps(data, indent=2 if a.once else None), flush=True)
        else:
            print(("\x1b[2J\x1b[H" if clear else "") + top_text(data), flush=True)

    if a.once:
        show(clear=False)
        return EXIT_OK
    try:
        while True:
            show(clear=True)
            time.sleep(a.interval)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_tui(c: AgentdClient, a: argparse.Namespace) -> int:
    from console.tui.app import AgentdTui  # textual loads only for this command

    if getattr(a, "json", False):
        print("agentctl tui is interactive and prints no JSON; for a summary as JSON use "
              "`agentctl top --once --json`", file=sys.stderr)
        return 2
    if not sys.stdout.isatty():
        print("agentctl tui needs a terminal; use `agentctl top --once` for text",
              file=sys.stderr)
        return 2
    client = AsyncAgentdClient(c.url, c.token, min(c.timeout, 5.0))
    AgentdTui(client, read_only=a.read_only, poll_interval=a.interval,
              ttft_slo_s=a.ttft_slo, kv_imbalance=a.kv_imbalance,
              idle_release_s=a.idle_release).run()
    return EXIT_OK


def _interval(text: str) -> float:
    value = float(text)
    if value < 0.1:
        raise argparse.ArgumentTypeError("the interval must be at least 0.1 seconds")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError("must be a number of seconds >= 0")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("must be a fraction in (0, 1]")
    return value


def add_tui_parser(subparsers: Any,
                   common: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """Add `tui` and `top` to agentctl's subparsers; `common` adds the shared flags."""
    tui = subparsers.add_parser("tui", help="interactive terminal UI (keys: ? in the app)",
                                description="interactive terminal UI; press ? for its keys")
    tui.add_argument("--read-only", action="store_true",
                     help="watch only: every action that changes the daemon is disabled")
    tui.add_argument("--interval", type=_interval, default=1.0, metavar="SECONDS",
                     help="poll interval (default: %(default)s)")
    tui.add_argument("--ttft-slo", type=_interval, default=1.0, metavar="SECONDS",
                     help="time-to-first-token SLO for the trace's verdicts on requests the "
                          "daemon did not tag with their task's SLO (default: %(default)s)")
    tui.add_argument("--kv-imbalance", type=_fraction, default=DEFAULT_KV_IMBALANCE,
                     metavar="FRACTION",
                     help="alert when healthy workers' KV usage differs by more than this "
                          "(default: %(default)s)")
    tui.add_argument("--idle-release", type=_seconds, default=DEFAULT_IDLE_RELEASE_S,
                     metavar="SECONDS", help="the programs view's bulk release (key i) takes "
                     "programs idle this long (default: %(default)s)")
    tui.set_defaults(tui_command=cmd_tui)
    top = subparsers.add_parser("top", help="a one-screen text summary, refreshed",
                                description="a one-screen text summary, refreshed")
    top.add_argument("--once", action="store_true", help="print once and exit")
    top.add_argument("--interval", type=_interval, default=2.0, metavar="SECONDS")
    top.set_defaults(tui_command=cmd_top)
    for parser in (tui, top):
        if common is not None:
            common(parser)
