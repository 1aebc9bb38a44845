"""Stored policies by layer, and one policy's version history."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from console.render import ago
from console.tui.widgets.keyed_table import Cell, KeyedTable

VERSION_STYLES = {"active": "bold green", "rolled_back": "yellow", "retired": "red"}


def policy_cells(p: dict[str, Any]) -> dict[str, Cell]:
    active = Text(f"★ v{p['active_version']}", style="bold green") if p.get("active") else "-"
    return {"name": p["name"], "layer": p["layer"], "active": active,
            "versions": str(p.get("versions", 0))}


def version_cells(v: dict[str, Any], now: float) -> dict[str, Cell]:
    report = v.get("validation") or {}
    valid = Text("ok", style="green") if report.get("ok") else Text("FAILED", style="bold red")
    return {"version": f"v{v['version']}",
            "status": Text(v["status"], style=VERSION_STYLES.get(v["status"], "")),
            "author": str(v.get("author") or "-"), "created": ago(v.get("created_at"), now),
            "valid": valid}


class PoliciesTable(KeyedTable):
    COLUMNS = (("name", "POLICY"), ("layer", "LAYER"), ("active", "ACTIVE"),
               ("versions", "VERSIONS"))

    def show(self, policies: list[dict[str, Any]]) -> None:
        ordered = sorted(policies, key=lambda p: (p["layer"], not p.get("active"), p["name"]))
        self.sync([(p["name"], policy_cells(p)) for p in ordered])


class VersionsTable(KeyedTable):
    COLUMNS = (("version", "VERSION"), ("status", "STATUS"), ("author", "AUTHOR"),
               ("created", "CREATED"), ("valid", "VALIDATION"))

    def show(self, versions: list[dict[str, Any]], now: float) -> None:
        newest_first = sorted(versions, key=lambda v: -int(v["version"]))
        self.sync([(str(v["version"]), version_cells(v, now)) for v in newest_first])

    @property
    def selected_version(self) -> int | None:
        key = self.selected_id
        return int(key) if key is not None else None
