"""Tool resources (containers, volumes, directories) grouped by the program that owns them."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from console.render import nbytes, seconds
from console.tui.widgets.keyed_table import Cell, KeyedTable

STATE_STYLES = {"running": "green", "idle": "", "created": "yellow", "exited": "grey62",
                "dead": "red"}


def row_key(t: dict[str, Any]) -> str:
    return f"{t.get('backend')}:{t.get('resource')}:{t.get('id')}"


def cells(t: dict[str, Any], program_status: str | None) -> dict[str, Cell]:
    state = str(t.get("state") or "-")
    return {"program": str(t.get("program_id") or "-"),
            "status": program_status or "-", "tool": str(t.get("tool") or "-"),
            "backend": str(t.get("backend")), "kind": str(t.get("resource")),
            "state": Text(state, style=STATE_STYLES.get(state, "")),
            "disk": nbytes(t.get("disk_bytes")), "age": seconds(t.get("age_s")),
            "name": str(t.get("name") or t.get("id") or "-")}


def grouped(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Resources by program, then tool, then kind; backend errors are not resources."""
    found = [t for t in tools if t.get("resource") != "error"]
    return sorted(found, key=lambda t: (str(t.get("program_id")), str(t.get("tool")),
                                        str(t.get("resource")), str(t.get("id"))))


class ToolsTable(KeyedTable):
    COLUMNS = (("program", "PROGRAM"), ("status", "PROGRAM STATUS"), ("tool", "TOOL"),
               ("backend", "BACKEND"), ("kind", "KIND"), ("state", "STATE"),
               ("disk", "DISK"), ("age", "AGE"), ("name", "NAME"))

    def show(self, tools: list[dict[str, Any]], statuses: dict[str, str]) -> None:
        self.sync([(row_key(t), cells(t, statuses.get(str(t.get("program_id")))))
                   for t in grouped(tools)])
