"""The programs view's bulk release of idle programs (key i): a confirmation listing what
the daemon would release, nothing sent on no or in read-only mode, the release on yes."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static

from console.client import AsyncAgentdClient
from console.tui.app import AgentdTui
from console.tui.screens.confirm import ConfirmModal
from console.tui.screens.programs import ProgramsScreen
from tests.daemon_process import DaemonProcess
from tests.ui.test_tui import SIZE, chat, program, until
from tests.waiting import wait_for

IDLE_S = 3.0


def idle_ids(d: DaemonProcess, idle_s: float) -> list[str]:
    r = d.post("/v1/programs/release-idle", json={"idle_s": idle_s, "dry_run": True})
    assert r.status_code == 200, r.text
    return [p["id"] for p in r.json()["data"]]


def tui(d: DaemonProcess, read_only: bool = False) -> AgentdTui:
    return AgentdTui(AsyncAgentdClient(d.url, d.token, timeout=5.0), read_only=read_only,
                     poll_interval=0.2, idle_release_s=IDLE_S)


async def test_release_idle_asks_then_releases_only_the_idle_ones(
        sim_daemon: DaemonProcess) -> None:
    d = sim_daemon
    chat(d, "ir-old", "ir-s")
    wait_for(lambda: "ir-old" in idle_ids(d, IDLE_S), 30, f"ir-old idle for {IDLE_S} s")

    async with tui(d, read_only=True).run_test(size=SIZE) as pilot:
        await pilot.press("2", "i")
        await pilot.pause(0.3)
        assert isinstance(pilot.app.screen, ProgramsScreen)  # no confirmation, nothing sent

    app = tui(d)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        chat(d, "ir-new", "ir-s")  # just active: not idle long enough
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the release plan")
        question = str(app.screen.query_one("#question", Static).render())
        assert "ir-old" in question and "ir-new" not in question, question
        await pilot.press("n")
        await pilot.pause(0.3)
        assert program(d, "ir-old")["status"] == "ACTING"

        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the release plan")
        await pilot.press("y")
        await until(pilot, lambda: app.last_action is not None, "the release")
        action: Any = app.last_action
        assert action.ok and action.detail == "released 1 program(s)", action
        assert (program(d, "ir-old")["status"], program(d, "ir-new")["status"]) == (
            "STOPPED", "ACTING")
