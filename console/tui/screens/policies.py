"""Policies: stored policies by layer, a policy's history, source, diffs and actions."""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from console.client import ClientError, api
from console.render import ago
from console.tui.data import Snapshot
from console.tui.screens.base import DaemonView, own_bindings
from console.tui.screens.policy_editor import PolicyEditorScreen
from console.tui.widgets.policy_pane import PolicyPane
from console.tui.widgets.policy_tables import PoliciesTable, VersionsTable

EVENTS_SHOWN = 6


def event_line(e: dict[str, Any], now: float) -> str:
    d = e.get("data") or {}
    what = e["kind"].removeprefix("policy.")
    extra = (f" → {d.get('restored')} v{d.get('restored_version')}: {d.get('reason')}"
             if what == "rolled_back" else f" by {d.get('by') or d.get('author') or '-'}")
    return f"{ago(float(e['ts']), now):>10}  {what} v{d.get('version')}{extra}"


class Loaded(Message):
    """A read for the view finished: `what` names which one."""

    def __init__(self, what: str, payload: Any) -> None:
        super().__init__()
        self.what = what
        self.payload = payload


class PoliciesScreen(DaemonView):
    BINDINGS = [
        Binding("tab", "app.focus_next", "next pane", show=False),
        Binding("s", "source", "source"),
        Binding("d", "diff", "diff with previous"),
        Binding("e", "edit", "edit"),
        Binding("v", "validate", "validate"),
        Binding("a", "activate", "activate"),
        Binding("b", "rollback", "roll back"),
    ]

    @classmethod
    def key_sections(cls) -> list[tuple[str, list[BindingType]]]:
        return [*super().key_sections(), ("policy editor", own_bindings(PolicyEditorScreen))]

    def __init__(self) -> None:
        super().__init__()
        self.detail: dict[str, Any] | None = None
        self.version: dict[str, Any] | None = None
        self._listed: dict[str, Any] = {}

    def compose_body(self) -> ComposeResult:
        yield Static("policies: loading…", id="policies-title", classes="title")
        with Horizontal(id="policies-top"):
            yield PoliciesTable(id="policy-list")
            with Vertical(id="policy-history"):
                yield VersionsTable(id="policy-versions")
                yield Static("", id="policy-events")
        yield PolicyPane(id="policy-pane")

    # --- reads ----------------------------------------------------------------------

    def show_snapshot(self, snapshot: Snapshot) -> None:
        if not self.query(PoliciesTable):
            return
        table = self.query_one(PoliciesTable)
        table.show(snapshot.policies)
        active = "   ".join(f"{layer}: {p}" for layer, p in snapshot.active_policies().items())
        self.query_one("#policies-title", Static).update(
            f"policies: {len(snapshot.policies)} stored   active — {active or 'none'}")
        listed = {p["name"]: p for p in snapshot.policies}
        name = table.selected_id
        if name is not None and listed.get(name) != self._listed.get(name):
            self.load_policy(name)  # a version was added or activated since the last read
        self._listed = listed

    @property
    def policy_name(self) -> str | None:
        return self.query_one(PoliciesTable).selected_id

    @property
    def selected_version(self) -> int | None:
        return self.query_one(VersionsTable).selected_version

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key is not None else None
        if key is None:
            return
        if event.data_table.id == "policy-list":
            self.load_policy(key)
        elif self.detail is not None:
            self.load_version(self.detail["name"], int(key))

    @work(exclusive=True, group="policy-read")
    async def load_policy(self, name: str) -> None:
        await self._read("policy", api.policy(name))

    @work(exclusive=True, group="policy-read")
    async def load_version(self, name: str, version: int) -> None:
        await self._read("version", api.policy_version(name, version))

    @work(exclusive=True, group="policy-diff")
    async def load_diff(self, name: str, old: int, new: int) -> None:
        await self._read("diff", api.policy_diff(name, old, new))

    async def _read(self, what: str, call: Any) -> None:
        try:
            self.post_message(Loaded(what, await self.agentd.client.call(call)))
        except ClientError as exc:
            self.notify(f"cannot read {call.path}: {exc.message}", severity="error")

    def on_loaded(self, message: Loaded) -> None:
        pane = self.query_one(PolicyPane)
        p = message.payload
        if message.what == "policy":
            versions = self.query_one(VersionsTable)
            if self.detail is None or self.detail["name"] != p["name"]:
                versions.clear()  # keys are version numbers: another policy's would collide
            self.detail = p
            versions.show(p["versions"], self.agentd.now())
            self.query_one("#policy-events", Static).update("\n".join(
                event_line(e, self.agentd.now()) for e in p.get("events", [])[-EVENTS_SHOWN:]))
            self.load_version(p["name"], self.selected_version or p["source_version"])
        elif message.what == "version":
            self.version = p
            if not pane.showing_diff:
                pane.show_source(p["name"], p["version"], p["source"])
            elif p["version"] > 1:  # keep showing diffs while moving through the history
                self.load_diff(p["name"], p["version"] - 1, p["version"])
            pane.show_report(p)
        elif message.what == "diff":
            pane.show_diff(p["name"], p["from"], p["to"], p["diff"])
        elif message.what == "validated":
            pane.show_report(p)
            self.load_policy(p["name"])

    # --- keys -----------------------------------------------------------------------

    def action_source(self) -> None:
        if self.version is not None:
            v = self.version
            self.query_one(PolicyPane).show_source(v["name"], v["version"], v["source"])

    def action_diff(self) -> None:
        name, version = self.policy_name, self.selected_version
        if name is None or version is None:
            return
        if version == 1:
            self.notify("v1 is the first version: nothing to diff against", severity="warning")
            return
        self.load_diff(name, version - 1, version)

    def action_edit(self) -> None:
        v, detail = self.version, self.detail
        if v is None or detail is None or not self.agentd.writable():
            return
        self.app.push_screen(PolicyEditorScreen(v["name"], detail["layer"], v["version"],
                                                v["source"]))

    def action_validate(self) -> None:
        name, version = self.policy_name, self.selected_version
        if name is not None and version is not None and self.agentd.writable():
            self.validate(name, version)

    @work(exclusive=True, group="policy-validate")
    async def validate(self, name: str, version: int) -> None:
        await self._read("validated", api.policy_validate(name, version))

    def action_activate(self) -> None:
        name, version = self.policy_name, self.selected_version
        if name is not None and version is not None:
            self.agentd.confirm_call(f"activate policy {name} v{version}",
                                     api.policy_activate(name, version))

    def action_rollback(self) -> None:
        snap, layer = self.agentd.snapshot, (self.detail or {}).get("layer")
        active = next((p for p in (snap.policies if snap else [])
                       if p.get("active") and p["layer"] == layer), None)
        if active is None:
            self.notify("no active policy in this layer to roll back", severity="warning")
            return
        self.agentd.confirm_call(
            f"roll back {layer} policy {active['name']} v{active['active_version']} to the "
            "version active before it", api.policy_rollback(active["name"]))
