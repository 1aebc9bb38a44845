"""A one-line bar that says the daemon cannot be reached (hidden while it can)."""

from __future__ import annotations

from textual.widgets import Static


class ErrorBar(Static):
    DEFAULT_CLASSES = "hidden"

    def show_error(self, error: str | None) -> None:
        if error is None:
            self.add_class("hidden")
            self.update("")
            return
        self.update(f"⚠ {error} — retrying")
        self.remove_class("hidden")

    @property
    def visible_error(self) -> bool:
        return not self.has_class("hidden")
