"""Tools: containers, volumes and directories by owning program; reclaim the orphans."""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from console.client import ClientError, api
from console.render import nbytes
from console.tui.data import Snapshot
from console.tui.screens.base import DaemonView
from console.tui.screens.confirm import ConfirmModal
from console.tui.widgets.tools_table import ToolsTable, row_key

LISTED = 8


def reclaim_question(planned: list[dict[str, Any]]) -> str:
    lines = [f"reclaim {len(planned)} tool resource(s) of programs that are not live?"]
    lines += [f"  {p.get('program_id')}  {p.get('tool')}  {p.get('resource')}  {p.get('name')}"
              for p in planned[:LISTED]]
    if len(planned) > LISTED:
        lines.append(f"  … and {len(planned) - LISTED} more")
    return "\n".join(lines)


def summary(tools: list[dict[str, Any]] | None) -> str:
    if tools is None:
        return "tools: loading…"
    found = [t for t in tools if t.get("resource") != "error"]
    programs = {t.get("program_id") for t in found}
    disk = sum(t.get("disk_bytes") or 0 for t in found)
    errors = [f"{t.get('backend')}: {(t.get('error') or {}).get('message', 'unreachable')}"
              for t in tools if t.get("resource") == "error"]
    line = (f"tools: {len(found)} resources held by {len(programs)} programs, "
            f"{nbytes(disk)} on disk")
    return line + (f"   [unavailable] {'; '.join(errors)}" if errors else "")


class ReclaimPlanned(Message):
    def __init__(self, planned: list[dict[str, Any]]) -> None:
        super().__init__()
        self.planned = planned


class ToolsScreen(DaemonView):
    BINDINGS = [
        Binding("g", "reclaim", "reclaim orphans"),
        Binding("d", "release", "release program"),
    ]

    def compose_body(self) -> ComposeResult:
        yield Static("tools: loading…", id="tools-title", classes="title")
        yield ToolsTable(id="tools")

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.agentd.refresh_slow()  # disk usage is fetched slowly; be current on arrival

    def show_snapshot(self, snapshot: Snapshot) -> None:
        if not self.query(ToolsTable):
            return
        statuses = {p["id"]: p["status"] for p in snapshot.programs}
        self.query_one(ToolsTable).show(snapshot.tools or [], statuses)
        self.query_one("#tools-title", Static).update(summary(snapshot.tools))

    def action_release(self) -> None:
        key = self.query_one(ToolsTable).selected_id
        tools = (self.agentd.snapshot.tools if self.agentd.snapshot else None) or []
        row = next((t for t in tools if row_key(t) == key), None)
        if row is None or not row.get("program_id"):
            self.notify("no tool resource selected", severity="warning")
            return
        self.agentd.confirm_program_action("release", str(row["program_id"]))

    def action_reclaim(self) -> None:
        if self.agentd.writable():
            self.plan_reclaim()

    @work(exclusive=True, group="reclaim")
    async def plan_reclaim(self) -> None:
        try:
            answer = await self.agentd.client.call(api.tools_gc(dry_run=True))
        except ClientError as exc:
            self.notify(f"reclaim failed: {exc.message}", severity="error")
            return
        self.post_message(ReclaimPlanned(answer["data"]))

    def on_reclaim_planned(self, message: ReclaimPlanned) -> None:
        if not message.planned:
            self.notify("nothing to reclaim: every tool resource belongs to a live program")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.agentd.send("reclaim tools", api.tools_gc(dry_run=False),
                                 lambda a: f"reclaimed {len(a['data'])} resource(s)")

        self.app.push_screen(ConfirmModal(reclaim_question(message.planned)), answered)
