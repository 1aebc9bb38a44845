"""Overview: health, workers (engine kind, KV gauge, load), rates, active policies, alerts."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from console.render import PROGRAM_STATUSES
from console.tui.alerts import Alert
from console.tui.data import Snapshot
from console.tui.rates import Rates
from console.tui.screens.base import DaemonView
from console.tui.widgets.worker_panel import WorkerPanel


def summary_line(url: str, snapshot: Snapshot) -> str:
    h = snapshot.health
    return (f"agentd at {url}: {h.get('status', '?')}   workers {h.get('workers_healthy', 0)}"
            f"/{h.get('workers', 0)} healthy   global queue {h.get('queued', 0)} requests")


def programs_line(snapshot: Snapshot) -> str:
    counts = Counter(p["status"] for p in snapshot.programs)
    by_status = "  ".join(f"{s} {counts.get(s, 0)}" for s in PROGRAM_STATUSES)
    shown = len(snapshot.programs)
    suffix = "" if shown == snapshot.programs_total else f" (newest {shown} counted)"
    return f"programs: {by_status}   total {snapshot.programs_total}{suffix}"


def policies_line(snapshot: Snapshot) -> str:
    active = snapshot.active_policies()
    layers = "   ".join(f"{layer}: {p}" for layer, p in sorted(active.items()))
    return f"active policy by layer — {layers or 'none reported'}"


def rate_titles(rates: Rates) -> tuple[str, str]:
    tput = rates.throughput[-1] if rates.throughput else 0.0
    good = rates.goodput[-1] if rates.goodput else 0.0
    peak = max(rates.throughput, default=0.0)
    return (f"throughput {tput:,.0f} generated tok/s (peak {peak:,.0f})",
            f"goodput {good:,.2f} req/s met their SLOs ({window_text(rates.window)})")


def window_text(window: dict[str, Any]) -> str:
    """The daemon's long-window goodput and attainment, in a few words."""
    if "seconds" not in window:
        return "no SLO window reported"
    span = f"{window['seconds']:.0f}s"
    if not window.get("completions"):
        return f"none finished in {span}"
    return (f"{span}: {window.get('goodput_rps', 0.0):.2f}/s, "
            f"{window.get('slo_attainment', 0.0):.0%} met")


def alerts_text(alerts: list[Alert]) -> Text:
    if not alerts:
        return Text("no alerts", style="green")
    out = Text()
    for i, a in enumerate(alerts):
        out.append(("\n" if i else "") + f"⚠ {a.text}",
                   style="bold red" if a.severity == "error" else "yellow")
    return out


class OverviewScreen(DaemonView):
    def compose_body(self) -> ComposeResult:
        yield Static("connecting…", id="summary", classes="title")
        yield WorkerPanel(id="workers")
        yield Static("", id="program-counts")
        yield Static("", id="active-policies")
        with Horizontal(id="rates"):
            with Vertical():
                yield Static("throughput", id="throughput-title")
                yield Sparkline([], id="throughput")
            with Vertical():
                yield Static("goodput", id="goodput-title")
                yield Sparkline([], id="goodput")
        yield Static("alerts", classes="title")
        yield Static("", id="alerts")

    def show_snapshot(self, snapshot: Snapshot) -> None:
        if not self.query(WorkerPanel):
            return  # not composed yet; on_screen_resume draws it
        app = self.agentd
        self.query_one("#summary", Static).update(summary_line(app.url, snapshot))
        self.query_one(WorkerPanel).show_workers(snapshot.workers)
        self.query_one("#program-counts", Static).update(programs_line(snapshot))
        self.query_one("#active-policies", Static).update(policies_line(snapshot))
        tput, good = rate_titles(app.rates)
        self.query_one("#throughput-title", Static).update(tput)
        self.query_one("#goodput-title", Static).update(good)
        self.query_one("#throughput", Sparkline).data = list(app.rates.throughput)
        self.query_one("#goodput", Sparkline).data = list(app.rates.goodput)
        self.query_one("#alerts", Static).update(alerts_text(app.alerts(snapshot)))
