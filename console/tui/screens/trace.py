"""Session trace: requests (queue wait, generation), pauses and migrations as bars."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Static

from console.client import ClientError
from console.trace_spans import build_spans
from console.tui.data import Snapshot, fetch_trace
from console.tui.messages import TraceLoaded
from console.tui.screens.base import DaemonView
from console.tui.timeline import GLYPHS, LEGEND, STYLES, describe
from console.tui.widgets.trace_timeline import TraceTimeline


def export_path(session_id: str, directory: Path, now: float) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", session_id)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return directory / f"agentd-trace-{safe}-{stamp}.json"


def legend() -> Text:
    out = Text()
    for kind in LEGEND:
        out.append(f"{GLYPHS[kind]} {kind}  ", style=STYLES[kind])
    return out


class TraceExported(Message):
    def __init__(self, path: Path | None, error: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.error = error


class TraceScreen(DaemonView):
    BINDINGS = [
        Binding("e", "export", "export JSON"),
        Binding("m", "migrate", "migrate session"),
        Binding("escape,backspace", "back", "back"),
    ]

    def nav_extra(self) -> str:
        return f"trace of session {self.session_id}"

    @classmethod
    def key_sections(cls) -> list[tuple[str, list[BindingType]]]:
        return [*super().key_sections(), ("timeline", list(TraceTimeline.BINDINGS))]

    def __init__(self, session_id: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []
        self.last_export: Path | None = None

    def compose_body(self) -> ComposeResult:
        yield Static(f"session {self.session_id}: loading…", id="trace-title", classes="title")
        yield Static(legend(), id="legend")
        yield TraceTimeline(id="timeline", clock=self.agentd.now)
        yield Static("select a row with ↑/↓ and press enter for its details",
                     id="span-details")

    def on_mount(self) -> None:
        self.query_one(TraceTimeline).focus()
        self.load_trace()

    def show_snapshot(self, snapshot: Snapshot) -> None:
        self.load_trace()

    @work(exclusive=True, group="trace")
    async def load_trace(self) -> None:
        try:
            # only what is new since the last read: a long session is not fetched every poll
            after = int(self.events[-1]["id"]) if self.events else 0
            events = self.events + await fetch_trace(self.agentd.client, self.session_id, after)
        except ClientError as exc:
            for title in self.query("#trace-title").results(Static):
                title.update(f"session {self.session_id}: {exc.message}")
            return
        self.post_message(TraceLoaded(self.session_id, events))

    def on_trace_loaded(self, message: TraceLoaded) -> None:
        self.events = message.events
        spans = build_spans(message.events)
        count = Counter(s.kind for s in spans)
        self.query_one("#trace-title", Static).update(
            f"session {self.session_id}: {len(message.events)} events, {count['program']} "
            f"programs, {count['request']} LLM requests, {count['tool'] + count['call']} tool "
            f"and agent calls, {count['migrate']} migrations, {count['decision']} decisions")
        self.query_one(TraceTimeline).show_spans(spans)

    def on_trace_timeline_span_selected(self, message: TraceTimeline.SpanSelected) -> None:
        self.query_one("#span-details", Static).update(
            describe(message.span, self.agentd.now(), self.agentd.ttft_slo_s))

    def action_export(self) -> None:
        self.write_export(list(self.events))

    @work(thread=True, group="export")
    def write_export(self, events: list[dict[str, Any]]) -> None:
        path = export_path(self.session_id, Path.cwd(), self.agentd.now())
        try:
            path.write_text(json.dumps({"session_id": self.session_id, "data": events},
                                       indent=2, ensure_ascii=False))
        except OSError as exc:
            self.post_message(TraceExported(None, f"cannot write {path}: {exc.strerror}"))
            return
        self.post_message(TraceExported(path))

    def on_trace_exported(self, message: TraceExported) -> None:
        if message.path is None:
            self.notify(message.error or "export failed", severity="error")
            return
        self.last_export = message.path
        self.query_one("#span-details", Static).update(f"trace exported to {message.path}")
        self.notify(f"exported to {message.path}")

    def action_migrate(self) -> None:
        self.agentd.migrate_session(self.session_id)

    def action_back(self) -> None:
        self.agentd.go_back()
