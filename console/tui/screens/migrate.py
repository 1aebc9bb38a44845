"""Choose where a session goes: a worker for its programs, or, when a workflow run works
in the session, an agent instance for its waiting agent calls (instance_moves.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from console.client import ClientError
from console.render import engine_label, percent
from console.tui.instance_moves import InstanceMove

LoadMoves = Callable[[], Awaitable[list[InstanceMove]]]
# what the modal answers: a worker id, an instance move, or None (cancelled)
MigrateTarget = str | InstanceMove


def worker_option(w: dict[str, Any]) -> Option:
    st = w.get("stats") or {}
    cap = st.get("kv_capacity_tokens") or w["kv_capacity_tokens"]
    text = (f"{w['id']}  {engine_label(w['engine'])}  {w['status']}  "
            f"kv {percent(st.get('kv_used_tokens', 0), cap)}  running {st.get('running', '-')}")
    return Option(text, id=str(w["id"]), disabled=w["status"] != "healthy")


class MovesLoaded(Message):
    def __init__(self, moves: list[InstanceMove] | None, error: str | None = None) -> None:
        super().__init__()
        self.moves = moves
        self.error = error


class MigrateModal(ModalScreen[MigrateTarget | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, session_id: str, workers: list[dict[str, Any]],
                 load_moves: LoadMoves | None = None) -> None:
        super().__init__()
        self.session_id = session_id
        self.targets = workers
        self.moves: list[InstanceMove] = []
        self._load_moves = load_moves

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"migrate session {self.session_id} to (enter picks, escape cancels):")
            yield OptionList(*[worker_option(w) for w in self.targets], id="targets")
            yield Label("agent instances: looking for workflow runs in this session…"
                        if self._load_moves else "", id="instances-note")

    def on_mount(self) -> None:
        if self._load_moves is not None:
            self.load_moves(self._load_moves)

    @work(exclusive=True, group="instances")
    async def load_moves(self, load: LoadMoves) -> None:
        try:
            self.post_message(MovesLoaded(await load()))
        except ClientError as exc:
            self.post_message(MovesLoaded(None, exc.message))

    def on_moves_loaded(self, message: MovesLoaded) -> None:
        note = self.query_one("#instances-note", Label)
        if message.moves is None:
            note.update(f"agent instances: {message.error}")
            return
        self.moves = message.moves
        if not self.moves:
            note.update("agent instances: no live workflow run in this session")
            return
        options = self.query_one(OptionList)
        runs = ", ".join(dict.fromkeys(m.run_id for m in self.moves))
        options.add_option(Option(f"── agent instances of run {runs} ──", disabled=True))
        options.add_options(Option(m.label(), disabled=not m.possible) for m in self.moves)
        note.update("an instance moves the session's waiting agent calls of its type")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        # by position: workers first, then the heading, then the moves
        index = event.option_index
        if index < len(self.targets):
            self.dismiss(str(self.targets[index]["id"]))
        elif index > len(self.targets):
            self.dismiss(self.moves[index - len(self.targets) - 1])

    def action_cancel(self) -> None:
        self.dismiss(None)
