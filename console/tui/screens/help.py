"""`?`: every key of the app, of the view underneath first, then of the other views."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

SYMBOLS = {"question_mark": "?", "colon": ":", "slash": "/", "escape": "esc",
           "backspace": "⌫", "enter": "⏎"}


def key_label(keys: str) -> str:
    return " ".join(SYMBOLS.get(k, k) for k in keys.split(","))


def key_lines(title: str, bindings: list[BindingType]) -> list[str]:
    lines = [f"[b]{title}[/b]"]
    for b in bindings:
        if isinstance(b, Binding):
            lines.append(f"  {key_label(b.key):<18} {b.description or b.action}")
        elif isinstance(b, tuple):
            lines.append(f"  {key_label(b[0]):<18} {b[2] if len(b) > 2 else b[1]}")
    return lines


class HelpModal(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def __init__(self, sections: list[tuple[str, list[BindingType]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        lines = [line for title, b in self.sections for line in key_lines(title, b)]
        with VerticalScroll(classes="dialog"):
            yield Static("\n".join(lines), id="keys")

    def action_close(self) -> None:
        self.dismiss(None)
