"""Overview: daemon health, workers (engine kind, KV gauge, load) and program counts."""

from __future__ import annotations

from collections import Counter

from textual.app import ComposeResult
from textual.widgets import Static

from console.render import PROGRAM_STATUSES
from console.tui.data import Snapshot
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


class OverviewScreen(DaemonView):
    def compose_body(self) -> ComposeResult:
        yield Static("connecting…", id="summary", classes="title")
        yield WorkerPanel(id="workers")
        yield Static("", id="program-counts")

    def show_snapshot(self, snapshot: Snapshot) -> None:
        if not self.query(WorkerPanel):
            return  # not composed yet; on_screen_resume draws it
        self.query_one("#summary", Static).update(summary_line(self.agentd.url, snapshot))
        self.query_one(WorkerPanel).show_workers(snapshot.workers)
        self.query_one("#program-counts", Static).update(programs_line(snapshot))
