"""Choose the worker a session's live programs move to."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from console.render import engine_label, percent


def worker_option(w: dict[str, Any]) -> Option:
    st = w.get("stats") or {}
    cap = st.get("kv_capacity_tokens") or w["kv_capacity_tokens"]
    text = (f"{w['id']}  {engine_label(w['engine'])}  {w['status']}  "
            f"kv {percent(st.get('kv_used_tokens', 0), cap)}  running {st.get('running', '-')}")
    return Option(text, id=str(w["id"]), disabled=w["status"] != "healthy")


class MigrateModal(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, session_id: str, workers: list[dict[str, Any]]) -> None:
        super().__init__()
        self.session_id = session_id
        self.targets = workers

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"migrate session {self.session_id} to (enter picks, escape cancels):")
            yield OptionList(*[worker_option(w) for w in self.targets], id="targets")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
