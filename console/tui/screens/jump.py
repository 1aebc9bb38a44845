"""`:` prompt: jump to a view by name (`overview`, `programs`, ..., `trace SESSION`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

VIEWS = ("overview", "programs", "sessions", "policies", "tools", "trace SESSION")


class JumpModal(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"jump to: {' | '.join(VIEWS)}")
            yield Input(placeholder="programs", id="jump")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
