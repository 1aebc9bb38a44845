"""Programs: a live table with a regex filter, status quick filters and operator actions."""

from __future__ import annotations

import re
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Input, Static

from console.client import ClientError, api
from console.render import PROGRAM_STATUSES
from console.tui.data import Snapshot
from console.tui.idle_release import IdlePlanned, idle_question, released
from console.tui.screens.base import DaemonView
from console.tui.widgets.programs_table import SORTS, ProgramsTable, sort_programs

STATUS_CYCLE: tuple[str | None, ...] = (None, *PROGRAM_STATUSES)


def compile_filter(text: str) -> tuple[re.Pattern[str], bool]:
    """The filter as a case-insensitive regex; (literal, False) when it does not compile."""
    try:
        return re.compile(text, re.IGNORECASE), True
    except re.error:
        return re.compile(re.escape(text), re.IGNORECASE), False


def matches(p: dict[str, Any], pattern: re.Pattern[str] | None, status: str | None) -> bool:
    if status is not None and p["status"] != status:
        return False
    if pattern is None:
        return True
    haystack = " ".join(str(p.get(k) or "") for k in ("id", "session_id", "worker_id",
                                                        "status", "status_reason"))
    return pattern.search(haystack) is not None


class ProgramsScreen(DaemonView):
    BINDINGS = [
        Binding("slash", "filter", "filter"),
        Binding("f", "cycle_status", "status"),
        Binding("escape", "clear_filters", "clear", show=False),
        Binding("p", "act('pause')", "pause"),
        Binding("r", "act('resume')", "resume"),
        Binding("d", "act('release')", "release"),
        Binding("x", "act('kill')", "kill"),
        Binding("i", "release_idle", "release idle"),
        Binding("m", "migrate", "migrate"),
        Binding("t", "trace", "trace"),
        Binding("s", "cycle_sort", "sort"),
        Binding("S", "reverse_sort", "reverse", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.pattern: re.Pattern[str] | None = None
        self.status: str | None = None
        self.sort = 0
        self.reverse = False

    def compose_body(self) -> ComposeResult:
        yield Static("", id="programs-title", classes="title")
        yield ProgramsTable(id="programs")
        yield Input(placeholder="regex over id, session, worker, status  (enter: keep, "
                                "escape: clear)", id="filter", classes="hidden")

    @property
    def table(self) -> ProgramsTable:
        return self.query_one(ProgramsTable)

    def show_snapshot(self, snapshot: Snapshot) -> None:
        if not self.query(ProgramsTable):
            return  # not composed yet; on_screen_resume draws it
        shown = sort_programs([p for p in snapshot.programs
                               if matches(p, self.pattern, self.status)],
                              self.sort, self.reverse)
        self.table.show(shown, self.agentd.now(), snapshot.tools_by_program())
        filters = [f"status={self.status}"] if self.status else []
        if self.pattern is not None:
            filters.append(f"/{self.pattern.pattern}/")
        how = f"  filter: {' '.join(filters)}" if filters else ""
        order = SORTS[self.sort][0] + (" (reversed)" if self.reverse else "")
        self.query_one("#programs-title", Static).update(
            f"programs: {len(shown)} shown of {snapshot.programs_total}   sort: {order}{how}")

    def _redraw(self) -> None:
        if self.agentd.snapshot is not None:
            self.show_snapshot(self.agentd.snapshot)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.remove_class("hidden")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        text = event.value.strip()
        self.pattern = None
        if text:
            self.pattern, ok = compile_filter(text)
            event.input.set_class(not ok, "invalid")
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.add_class("hidden")
        self.table.focus()

    def action_clear_filters(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.add_class("hidden")
        self.pattern, self.status = None, None
        self.table.focus()
        self._redraw()

    def action_cycle_status(self) -> None:
        index = STATUS_CYCLE.index(self.status)
        self.status = STATUS_CYCLE[(index + 1) % len(STATUS_CYCLE)]
        self._redraw()

    def action_cycle_sort(self) -> None:
        self.sort = (self.sort + 1) % len(SORTS)
        self._redraw()

    def action_reverse_sort(self) -> None:
        self.reverse = not self.reverse
        self._redraw()

    def _selected(self) -> dict[str, Any] | None:
        pid = self.table.selected_id
        snapshot = self.agentd.snapshot
        if pid is None or snapshot is None:
            self.notify("no program selected", severity="warning")
            return None
        return next((p for p in snapshot.programs if p["id"] == pid), None)

    def action_act(self, action: str) -> None:
        program = self._selected()
        if program is not None:
            self.agentd.confirm_program_action(action, program["id"])

    def action_release_idle(self) -> None:
        if self.agentd.writable():
            self.plan_release_idle(self.agentd.idle_release_s)

    @work(exclusive=True, group="release-idle")
    async def plan_release_idle(self, idle_s: float) -> None:
        try:
            answer = await self.agentd.client.call(api.release_idle(idle_s, dry_run=True))
        except ClientError as exc:
            self.notify(f"release idle failed: {exc.message}", severity="error")
            return
        self.post_message(IdlePlanned(idle_s, answer["data"]))

    def on_idle_planned(self, message: IdlePlanned) -> None:
        if not message.planned:
            self.notify(f"no program idle for {message.idle_s:g} s or more")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.agentd.send(f"release programs idle for {message.idle_s:g} s",
                                 api.release_idle(message.idle_s), released)

        self.agentd.ask(idle_question(message.idle_s, message.planned), answered)

    def action_migrate(self) -> None:
        program = self._selected()
        if program is not None:
            self.agentd.migrate_session(program["session_id"])

    def action_trace(self) -> None:
        program = self._selected()
        if program is not None:
            self.agentd.show_trace(program["session_id"])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_trace()
