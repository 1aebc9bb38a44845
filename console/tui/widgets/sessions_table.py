"""Sessions as a table keyed by session id."""

from __future__ import annotations

from typing import Any

from console.render import ago
from console.tui.widgets.keyed_table import KeyedTable


def cells(s: dict[str, Any], now: float) -> dict[str, str]:
    return {"id": s["id"], "tenant": str(s.get("tenant") or "-"),
            "priority": str(s.get("priority", "-")), "slo": str(s.get("slo_class") or "-"),
            "pinned": str(s.get("pinned_worker") or "-"), "programs": str(s.get("programs", 0)),
            "created": ago(s.get("created_at"), now), "updated": ago(s.get("updated_at"), now)}


class SessionsTable(KeyedTable):
    COLUMNS = (("id", "SESSION"), ("tenant", "TENANT"), ("priority", "PRIORITY"),
               ("slo", "SLO CLASS"), ("pinned", "PINNED"), ("programs", "PROGRAMS"),
               ("created", "CREATED"), ("updated", "UPDATED"))

    def show(self, sessions: list[dict[str, Any]], now: float) -> None:
        self.sync([(s["id"], cells(s, now)) for s in sessions])
