"""One line naming the views, the current one marked; each name is clickable."""

from __future__ import annotations

from textual.widgets import Static

VIEW_NAMES = ("overview", "programs", "sessions", "policies", "tools")


def nav_markup(current: str, extra: str = "") -> str:
    parts = []
    for number, name in enumerate(VIEW_NAMES, start=1):
        style = "reverse bold" if name == current else "dim"
        parts.append(f"[@click=app.show('{name}')][{style}] {number} {name} [/][/]")
    return " ".join(parts) + (f"   [bold]{extra}[/]" if extra else "")


class NavBar(Static):
    def __init__(self, current: str, extra: str = "") -> None:
        super().__init__(nav_markup(current, extra), id="nav")
