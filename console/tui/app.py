"""`agentctl tui`: the Textual app, its poller and the operator actions.

All daemon I/O runs in Textual workers that post typed messages back; handlers on
the UI thread only redraw. Screens are one per file under `screens/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType

from console.client import AsyncAgentdClient, Call, ClientError
from console.tui import DEFAULT_IDLE_RELEASE_S
from console.tui.alerts import DEFAULT_KV_IMBALANCE, Alert, alerts
from console.tui.data import Clock, Poller, Snapshot, migrate_session, program_action
from console.tui.instance_moves import InstanceMove, decision_outcome, fetch_instance_moves
from console.tui.messages import ActionDone, DaemonUnreachable, SnapshotLoaded
from console.tui.rates import Rates
from console.tui.screens.base import DaemonView
from console.tui.screens.confirm import ConfirmModal
from console.tui.screens.help import HelpModal
from console.tui.screens.jump import JumpModal
from console.tui.screens.migrate import MigrateModal, MigrateTarget
from console.tui.screens.overview import OverviewScreen
from console.tui.screens.policies import PoliciesScreen
from console.tui.screens.programs import ProgramsScreen
from console.tui.screens.sessions import SessionsScreen
from console.tui.screens.tools import ToolsScreen
from console.tui.screens.trace import TraceScreen
from console.tui.shutdown import finish_workers

DEFAULT_POLL_S = 1.0
DEFAULT_TTFT_SLO_S = 1.0
# name → (screen class, aliases accepted by `:`)
VIEWS: dict[str, tuple[type[DaemonView], tuple[str, ...]]] = {
    "overview": (OverviewScreen, ("o", "workers")),
    "programs": (ProgramsScreen, ("p",)),
    "sessions": (SessionsScreen, ("s",)),
    "policies": (PoliciesScreen, ("pol", "policy")),
    "tools": (ToolsScreen, ("t",)),
}


class AgentdTui(App[None]):
    CSS_PATH = "tui.tcss"
    TITLE = "agentd"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show('overview')", "overview", show=False),
        Binding("2", "show('programs')", "programs", show=False),
        Binding("3", "show('sessions')", "sessions", show=False),
        Binding("4", "show('policies')", "policies", show=False),
        Binding("5", "show('tools')", "tools", show=False),
        Binding("colon", "jump", "jump"),
        Binding("question_mark,f1", "help", "keys"),
        Binding("ctrl+r", "poll_now", "refresh", show=False),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, client: AsyncAgentdClient, read_only: bool = False,
                 poll_interval: float = DEFAULT_POLL_S, *, clock: Clock = time.time,
                 ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
                 kv_imbalance: float = DEFAULT_KV_IMBALANCE,
                 idle_release_s: float = DEFAULT_IDLE_RELEASE_S) -> None:
        super().__init__()
        self.idle_release_s = idle_release_s  # the programs view's bulk release (i)
        self.client = client
        self.read_only = read_only
        self.poll_interval = poll_interval
        self.now = clock
        self.ttft_slo_s = ttft_slo_s
        self.kv_imbalance = kv_imbalance
        self.poller = Poller(client, clock)
        self.rates = Rates()
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        self.last_action: ActionDone | None = None
        self.view = "overview"
        self._wake = asyncio.Event()

    @property
    def url(self) -> str:
        return self.client.url

    def on_mount(self) -> None:
        for name, (screen, _) in VIEWS.items():
            self.install_screen(screen(), name)
        self.push_screen("overview")
        self.sub_title = self.url + ("  [read-only]" if self.read_only else "")
        self.poll()

    async def on_unmount(self) -> None:
        stuck = await finish_workers(self.workers)
        if stuck:
            # Closing under them would make them fail; the process is exiting anyway.
            self.log.warning(f"left the client open for workers still running: {stuck}")
            return
        await self.client.aclose()

    # --- polling ----------------------------------------------------------------------

    @work(exclusive=True, group="poll")
    async def poll(self) -> None:
        """Poll forever; a failure shows the error bar and the next success clears it."""
        while True:
            try:
                self.post_message(SnapshotLoaded(await self.poller.snapshot()))
            except ClientError as exc:
                self.post_message(DaemonUnreachable(exc.message))
            except (KeyError, TypeError, ValueError) as exc:
                self.post_message(DaemonUnreachable(f"unexpected answer from the daemon "
                                                    f"({type(exc).__name__}: {exc})"))
            self._wake.clear()
            # Not wait_for: on 3.11 it drops a cancel that lands as the wake fires.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()

    def action_poll_now(self) -> None:
        self._wake.set()

    def refresh_slow(self) -> None:
        """Poll now, tools and policy events included."""
        self.poller.force_slow()
        self.action_poll_now()

    def _views(self) -> list[DaemonView]:
        return [s for s in self.screen_stack if isinstance(s, DaemonView) and s.is_mounted]

    def on_snapshot_loaded(self, message: SnapshotLoaded) -> None:
        self.snapshot = message.snapshot
        self.rates.add(message.snapshot)
        self.error = None
        for view in self._views():
            view.show_error(None)
            view.show_snapshot(message.snapshot)

    def on_daemon_unreachable(self, message: DaemonUnreachable) -> None:
        self.error = message.error
        for view in self._views():
            view.show_error(message.error)

    def alerts(self, snapshot: Snapshot) -> list[Alert]:
        return alerts(snapshot, self.now(), self.kv_imbalance)

    # --- navigation -------------------------------------------------------------------

    def _go(self, screen: str | DaemonView) -> None:
        while len(self.screen_stack) > 2:  # drop modals and editors over the current view
            self.pop_screen()
        self.switch_screen(screen)

    def action_show(self, view: str) -> None:
        self.view = view
        self._go(view)

    def action_show_overview(self) -> None:
        self.action_show("overview")

    def action_show_programs(self) -> None:
        self.action_show("programs")

    def show_trace(self, session_id: str) -> None:
        self._go(TraceScreen(session_id))

    def go_back(self) -> None:
        """From a trace to the view it was opened from."""
        self._go(self.view)

    def action_jump(self) -> None:
        self.push_screen(JumpModal(), self._jump_to)

    def _jump_to(self, target: str | None) -> None:
        words = (target or "").split()
        if not words:
            return
        if words[0] in ("trace", "tr") and len(words) == 2:
            self.show_trace(words[1])
            return
        for name, (_, aliases) in VIEWS.items():
            if words[0] == name or words[0] in aliases:
                self.action_show(name)
                return
        self.notify(f"no view {target!r}: try {', '.join(VIEWS)} or trace SESSION",
                    severity="warning")

    def action_help(self) -> None:
        sections: list[tuple[str, list[BindingType]]] = [("everywhere", self.BINDINGS)]
        current = self.screen if isinstance(self.screen, DaemonView) else None
        if current is not None:
            sections += current.key_sections()
        screens: list[type[DaemonView]] = [*(view for view, _ in VIEWS.values()), TraceScreen]
        for screen in screens:
            if current is None or type(current) is not screen:
                sections += screen.key_sections()
        self.push_screen(HelpModal([(title, keys) for title, keys in sections if keys]))

    # --- operator actions -------------------------------------------------------------

    def writable(self) -> bool:
        if self.read_only:
            self.notify("read-only: actions are disabled (started with --read-only)",
                        severity="warning")
        return not self.read_only

    def ask(self, question: str, answered: Callable[[bool | None], None]) -> None:
        self.push_screen(ConfirmModal(question), answered)

    def confirm_call(self, description: str, call: Call) -> None:
        """Ask, then send `call`; nothing is sent in read-only mode or on 'no'."""
        if not self.writable():
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send(description, call)

        self.ask(f"{description}?", answered)

    def confirm_program_action(self, action: str, program_id: str) -> None:
        self.confirm_call(f"{action} program {program_id}", program_action(action, program_id))

    def migrate_session(self, session_id: str) -> None:
        if not self.writable():
            return
        if self.snapshot is None or not self.snapshot.workers:
            self.notify("no workers known yet", severity="warning")
            return

        def chosen(target: MigrateTarget | None) -> None:
            if isinstance(target, InstanceMove):
                self.send(target.describe(), target.call(), decision_outcome)
            elif target:
                self.send(f"migrate session {session_id} to {target}",
                          migrate_session(session_id, target))

        modal = MigrateModal(session_id, self.snapshot.workers,
                             lambda: fetch_instance_moves(self.client, session_id))
        self.push_screen(modal, chosen)

    @work(group="actions")
    async def send(self, description: str, call: Call,
                   summarize: Callable[[Any], str] | None = None) -> None:
        try:
            answer = await self.client.call(call)
            detail = summarize(answer) if summarize else "done"
        except ClientError as exc:  # `summarize` raises it for an answer that says no
            self.post_message(ActionDone(description, False, exc.message))
            return
        self.post_message(ActionDone(description, True, detail, answer))

    def on_action_done(self, message: ActionDone) -> None:
        self.last_action = message
        if message.ok:
            self.notify(f"{message.description}: {message.detail}")
        else:
            self.notify(f"{message.description} failed: {message.detail}", severity="error")
        self.refresh_slow()
