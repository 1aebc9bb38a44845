"""The frame every daemon view shares: error bar on top, key footer below."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from console.tui.data import Snapshot
from console.tui.widgets.error_bar import ErrorBar

if TYPE_CHECKING:
    from console.tui.app import AgentdTui


class DaemonView(Screen[None]):
    """A screen that shows daemon state; the app hands it each poll's result."""

    def compose(self) -> ComposeResult:
        yield ErrorBar(id="error-bar")
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    @property
    def agentd(self) -> AgentdTui:
        return cast("AgentdTui", self.app)

    def on_screen_resume(self) -> None:
        self.show_error(self.agentd.error)
        if self.agentd.snapshot is not None:
            self.show_snapshot(self.agentd.snapshot)

    def show_error(self, error: str | None) -> None:
        # a poll can land between the screen's mount and its children's
        for bar in self.query(ErrorBar):
            bar.show_error(error)

    def show_snapshot(self, snapshot: Snapshot) -> None:
        """Redraw from a fresh poll; called only after the screen is mounted."""
