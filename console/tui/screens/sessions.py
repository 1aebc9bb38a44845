"""Sessions: newest first, refreshed with each poll; enter opens the session's trace."""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Static

from console.client import ClientError
from console.tui.data import Snapshot, fetch_sessions
from console.tui.screens.base import DaemonView
from console.tui.widgets.sessions_table import SessionsTable


class SessionsLoaded(Message):
    def __init__(self, sessions: list[dict[str, Any]], total: int) -> None:
        super().__init__()
        self.sessions = sessions
        self.total = total


class SessionsScreen(DaemonView):
    BINDINGS = [
        Binding("enter,t", "trace", "trace"),
        Binding("m", "migrate", "migrate session"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[dict[str, Any]] = []

    def compose_body(self) -> ComposeResult:
        yield Static("sessions: loading…", id="sessions-title", classes="title")
        yield SessionsTable(id="sessions")

    def show_snapshot(self, snapshot: Snapshot) -> None:
        self.load()

    @work(exclusive=True, group="sessions")
    async def load(self) -> None:
        try:
            sessions, total = await fetch_sessions(self.agentd.client)
        except ClientError:
            return  # the poller's error bar already says why
        self.post_message(SessionsLoaded(sessions, total))

    def on_sessions_loaded(self, message: SessionsLoaded) -> None:
        self.sessions = message.sessions
        self.query_one(SessionsTable).show(message.sessions, self.agentd.now())
        self.query_one("#sessions-title", Static).update(
            f"sessions: {len(message.sessions)} shown of {message.total}, newest first   "
            "(enter: trace)")

    def _selected(self) -> str | None:
        sid = self.query_one(SessionsTable).selected_id
        if sid is None:
            self.notify("no session selected", severity="warning")
        return sid

    def action_trace(self) -> None:
        sid = self._selected()
        if sid is not None:
            self.agentd.show_trace(sid)

    def action_migrate(self) -> None:
        sid = self._selected()
        if sid is not None:
            self.agentd.migrate_session(sid)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_trace()
