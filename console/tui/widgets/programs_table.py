"""The live programs table: rows keyed by program id and updated in place."""

from __future__ import annotations

import time
from typing import Any

from textual.widgets import DataTable

from console.render import seconds

COLUMNS = (("id", "PROGRAM"), ("status", "STATUS"), ("session", "SESSION"),
           ("worker", "WORKER"), ("tokens", "TOKENS"), ("steps", "STEPS"),
           ("in_state", "IN STATE"))


def cells(p: dict[str, Any], now: float) -> dict[str, str]:
    held = " (held)" if p.get("held") and p["status"] != "PAUSED" else ""
    return {"id": p["id"], "status": p["status"] + held, "session": p["session_id"],
            "worker": p.get("worker_id") or "-", "tokens": str(p["context_tokens"]),
            "steps": str(p["steps"]),
            "in_state": seconds(max(0.0, now - float(p.get("status_since") or now)))}


class ProgramsTable(DataTable[str]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row")
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def sync(self, programs: list[dict[str, Any]], now: float | None = None) -> None:
        """Make the rows equal `programs`, touching only cells that changed."""
        now = time.time() if now is None else now
        wanted = {p["id"]: cells(p, now) for p in programs}
        for key in [k for k in self.rows if k.value not in wanted]:
            self.remove_row(key)
        for pid, row in wanted.items():
            if pid not in self.rows:
                self.add_row(*row.values(), key=pid)
                continue
            for column, value in row.items():
                if self.get_cell(pid, column) != value:
                    self.update_cell(pid, column, value)

    @property
    def selected_id(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return key.value
