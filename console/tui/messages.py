"""Typed messages that workers post back to the UI thread."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from console.tui.data import Snapshot


class SnapshotLoaded(Message):
    """A poll succeeded."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class DaemonUnreachable(Message):
    """A poll failed; `error` is one line for the error bar."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class TraceLoaded(Message):
    def __init__(self, session_id: str, events: list[dict[str, Any]]) -> None:
        super().__init__()
        self.session_id = session_id
        self.events = events


class ActionDone(Message):
    """An operator action finished; `ok` False when the daemon refused it."""

    def __init__(self, description: str, ok: bool, detail: str, answer: Any = None) -> None:
        super().__init__()
        self.description = description
        self.ok = ok
        self.detail = detail
        self.answer = answer
