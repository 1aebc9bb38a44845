"""The frame every daemon view shares: error bar on top, key footer below."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.screen import Screen
from textual.widgets import Footer

from console.tui.data import Snapshot
from console.tui.widgets.error_bar import ErrorBar
from console.tui.widgets.nav_bar import NavBar

if TYPE_CHECKING:
    from console.tui.app import AgentdTui


class DaemonView(Screen[None]):
    """A screen that shows daemon state; the app hands it each poll's result."""

    def compose(self) -> ComposeResult:
        yield ErrorBar(id="error-bar")
        yield NavBar(self.view_name, self.nav_extra())
        yield from self.compose_body()
        yield Footer()

    def nav_extra(self) -> str:
        """What the nav bar says after the view names (where a sub-view is)."""
        return ""

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

    @property
    def view_name(self) -> str:
        return type(self).__name__.removesuffix("Screen").lower()

    @classmethod
    def key_sections(cls) -> list[tuple[str, list[BindingType]]]:
        """The keys `?` lists for this view."""
        return [(cls.__name__.removesuffix("Screen").lower(), own_bindings(cls))]


def own_bindings(cls: type) -> list[BindingType]:
    """The keys a class declares itself, not those every Screen inherits (tab, ...)."""
    return list(vars(cls).get("BINDINGS", []))
