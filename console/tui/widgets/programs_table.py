"""The live programs table: rows keyed by program id and updated in place."""

from __future__ import annotations

from typing import Any

from console.render import seconds
from console.tui.widgets.keyed_table import KeyedTable

# sort orders the `s` key cycles through: (name, key of a program dict, descending first)
SORTS: tuple[tuple[str, str, bool], ...] = (
    ("newest", "created_at", True), ("status", "status", False),
    ("tokens", "context_tokens", True), ("steps", "steps", True),
    ("time in state", "status_since", False), ("worker", "worker_id", False),
    ("session", "session_id", False),
)


def cells(p: dict[str, Any], now: float, tools: list[str]) -> dict[str, str]:
    held = " (held)" if p.get("held") and p["status"] != "PAUSED" else ""
    return {"id": p["id"], "status": p["status"] + held,
            "reason": p.get("status_reason") or "-", "session": p["session_id"],
            "worker": p.get("worker_id") or "-", "tokens": str(p["context_tokens"]),
            "steps": str(p["steps"]),
            "in_state": seconds(max(0.0, now - float(p.get("status_since") or now))),
            "tools": ",".join(tools) or "-"}


def sort_programs(programs: list[dict[str, Any]], sort: int,
                  reverse: bool) -> list[dict[str, Any]]:
    _, key, descending = SORTS[sort]

    def value(p: dict[str, Any]) -> tuple[bool, Any]:
        v = p.get(key)
        return (v is None, v if v is not None else 0)

    return sorted(programs, key=value, reverse=descending != reverse)


class ProgramsTable(KeyedTable):
    COLUMNS = (("id", "PROGRAM"), ("status", "STATUS"), ("reason", "REASON"),
               ("session", "SESSION"), ("worker", "WORKER"), ("tokens", "TOKENS"),
               ("steps", "STEPS"), ("in_state", "IN STATE"), ("tools", "TOOLS"))

    def show(self, programs: list[dict[str, Any]], now: float,
             tools: dict[str, list[str]]) -> None:
        self.sync([(p["id"], cells(p, now, tools.get(p["id"], []))) for p in programs])
