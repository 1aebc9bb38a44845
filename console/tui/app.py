"""`agentctl tui`: the Textual app, its poller and the operator actions.

All daemon I/O runs in Textual workers that post typed messages back; handlers on
the UI thread only redraw. Screens are one per file under `screens/`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType

from console.client import AsyncAgentdClient, Call, ClientError
from console.tui.data import Snapshot, fetch_snapshot, migrate_session, program_action
from console.tui.messages import ActionDone, DaemonUnreachable, SnapshotLoaded
from console.tui.screens.base import DaemonView
from console.tui.screens.confirm import ConfirmModal
from console.tui.screens.help import HelpModal
from console.tui.screens.jump import JumpModal
from console.tui.screens.migrate import MigrateModal
from console.tui.screens.overview import OverviewScreen
from console.tui.screens.programs import ProgramsScreen
from console.tui.screens.trace import TraceScreen

DEFAULT_POLL_S = 1.0


class AgentdTui(App[None]):
    CSS_PATH = "tui.tcss"
    TITLE = "agentd"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_overview", "overview"),
        Binding("2", "show_programs", "programs"),
        Binding("colon", "jump", "jump"),
        Binding("question_mark", "help", "keys"),
        Binding("ctrl+r", "poll_now", "refresh", show=False),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, client: AsyncAgentdClient, read_only: bool = False,
                 poll_interval: float = DEFAULT_POLL_S) -> None:
        super().__init__()
        self.client = client
        self.read_only = read_only
        self.poll_interval = poll_interval
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        self._wake = asyncio.Event()

    @property
    def url(self) -> str:
        return self.client.url

    def on_mount(self) -> None:
        self.install_screen(OverviewScreen(), "overview")
        self.install_screen(ProgramsScreen(), "programs")
        self.push_screen("overview")
        self.sub_title = self.url + ("  [read-only]" if self.read_only else "")
        self.poll()

    async def on_unmount(self) -> None:
        await self.client.aclose()

    # --- polling ----------------------------------------------------------------------

    @work(exclusive=True, group="poll")
    async def poll(self) -> None:
        """Poll forever; a failure shows the error bar and the next success clears it."""
        while True:
            try:
                self.post_message(SnapshotLoaded(await fetch_snapshot(self.client)))
            except ClientError as exc:
                self.post_message(DaemonUnreachable(exc.message))
            except (KeyError, TypeError, ValueError) as exc:
                self.post_message(DaemonUnreachable(f"unexpected answer from the daemon "
                                                    f"({type(exc).__name__}: {exc})"))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)

    def action_poll_now(self) -> None:
        self._wake.set()

    def _views(self) -> list[DaemonView]:
        return [s for s in self.screen_stack if isinstance(s, DaemonView) and s.is_mounted]

    def on_snapshot_loaded(self, message: SnapshotLoaded) -> None:
        self.snapshot = message.snapshot
        self.error = None
        for view in self._views():
            view.show_error(None)
            view.show_snapshot(message.snapshot)

    def on_daemon_unreachable(self, message: DaemonUnreachable) -> None:
        self.error = message.error
        for view in self._views():
            view.show_error(message.error)

    # --- navigation -------------------------------------------------------------------

    def _go(self, screen: str | DaemonView) -> None:
        while len(self.screen_stack) > 2:  # drop modals over the current view
            self.pop_screen()
        self.switch_screen(screen)

    def action_show_overview(self) -> None:
        self._go("overview")

    def action_show_programs(self) -> None:
        self._go("programs")

    def show_trace(self, session_id: str) -> None:
        self._go(TraceScreen(session_id))

    def action_jump(self) -> None:
        self.push_screen(JumpModal(), self._jump_to)

    def _jump_to(self, target: str | None) -> None:
        words = (target or "").split()
        if not words:
            return
        if words[0] in ("overview", "o", "workers"):
            self.action_show_overview()
        elif words[0] in ("programs", "p"):
            self.action_show_programs()
        elif words[0] in ("trace", "t") and len(words) == 2:
            self.show_trace(words[1])
        else:
            self.notify(f"no view {target!r}: try overview, programs, trace SESSION",
                        severity="warning")

    def action_help(self) -> None:
        sections: list[tuple[str, list[BindingType]]] = [("everywhere", self.BINDINGS)]
        if isinstance(self.screen, DaemonView):
            sections.append((type(self.screen).__name__.removesuffix("Screen").lower(),
                             list(self.screen.BINDINGS)))
        self.push_screen(HelpModal(sections))

    # --- operator actions -------------------------------------------------------------

    def _writable(self) -> bool:
        if self.read_only:
            self.notify("read-only: actions are disabled (started with --read-only)",
                        severity="warning")
        return not self.read_only

    def confirm_program_action(self, action: str, program_id: str) -> None:
        if not self._writable():
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send(f"{action} {program_id}", program_action(action, program_id))

        self.push_screen(ConfirmModal(f"{action} program {program_id}?"), answered)

    def migrate_session(self, session_id: str) -> None:
        if not self._writable():
            return
        if self.snapshot is None or not self.snapshot.workers:
            self.notify("no workers known yet", severity="warning")
            return

        def chosen(worker_id: str | None) -> None:
            if worker_id:
                self.send(f"migrate session {session_id} to {worker_id}",
                          migrate_session(session_id, worker_id))

        self.push_screen(MigrateModal(session_id, self.snapshot.workers), chosen)

    @work(group="actions")
    async def send(self, description: str, call: Call) -> None:
        try:
            answer = await self.client.call(call)
        except ClientError as exc:
            self.post_message(ActionDone(description, False, exc.message))
            return
        self.post_message(ActionDone(description, True, str(answer)))

    def on_action_done(self, message: ActionDone) -> None:
        if message.ok:
            self.notify(f"{message.description}: done")
        else:
            self.notify(f"{message.description} failed: {message.detail}", severity="error")
        self.action_poll_now()
