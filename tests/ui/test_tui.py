"""`agentctl tui` and `agentctl top` against a real daemon with simulated workers."""

from __future__ import annotations

import argparse
import html
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList

from console.client import AgentdClient, AsyncAgentdClient
from console.tui import add_tui_parser
from console.tui.app import AgentdTui
from console.tui.screens.confirm import ConfirmModal
from console.tui.screens.help import HelpModal
from console.tui.screens.migrate import MigrateModal
from console.tui.screens.overview import OverviewScreen
from console.tui.screens.programs import ProgramsScreen
from console.tui.screens.trace import TraceScreen
from console.tui.widgets.error_bar import ErrorBar
from console.tui.widgets.programs_table import ProgramsTable
from console.tui.widgets.trace_timeline import TraceTimeline
from tests.daemon_process import DaemonProcess

SIZE = (130, 36)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the SVG screenshots go: $AGENTD_TUI_SHOTS (e.g. bench/results), else a tmp dir."""
    chosen = os.environ.get("AGENTD_TUI_SHOTS")
    path = Path(chosen).resolve() if chosen else tmp_path_factory.mktemp("screens")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("tui") / "data", workers=2).start()
    yield d
    d.stop()


def make_program(d: DaemonProcess, program_id: str, session_id: str) -> None:
    body = {"model": "sim-llama3-8b", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8, "program_id": program_id, "session_id": session_id}
    r = d.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def program(d: DaemonProcess, program_id: str) -> dict[str, Any]:
    r = d.get(f"/v1/programs/{program_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def tui(d: DaemonProcess, read_only: bool = False) -> AgentdTui:
    client = AsyncAgentdClient(d.url, d.token, timeout=2.0)
    return AgentdTui(client, read_only=read_only, poll_interval=0.2)


async def until(pilot: Pilot[None], cond: Callable[[], bool], what: str,
                timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def svg_text(app: AgentdTui, directory: Path, name: str) -> str:
    path = Path(app.save_screenshot(filename=name, path=str(directory)))
    print(f"screenshot: {path}")
    return html.unescape(path.read_text()).replace("\xa0", " ")


async def select_program(pilot: Pilot[None], program_id: str) -> ProgramsTable:
    await pilot.press("2")
    table = pilot.app.screen.query_one(ProgramsTable)
    await until(pilot, lambda: program_id in [k.value for k in table.rows], "program row")
    await pilot.press("slash", *program_id, "enter")
    await until(pilot, lambda: table.row_count == 1 and table.selected_id == program_id,
                "the filter to leave only the program")
    return table


async def test_navigation_overview_and_programs_table(daemon: DaemonProcess,
                                                      shots: Path) -> None:
    make_program(daemon, "nav-p1", "nav-s1")
    app = tui(daemon)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.snapshot is not None, "first poll")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.pause(0.1)
        shot = svg_text(app, shots, "tui-overview.svg")
        assert "sim (simulated)" in shot and "local-sim-1" in shot and "KV USAGE" in shot

        await pilot.press("2")
        assert isinstance(app.screen, ProgramsScreen)
        table = app.screen.query_one(ProgramsTable)
        await until(pilot, lambda: "nav-p1" in [k.value for k in table.rows], "program row")
        assert table.get_cell("nav-p1", "session") == "nav-s1"

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpModal)
        await pilot.press("escape")
        await pilot.press("colon", *"overview", "enter")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("colon", *"trace nav-s1", "enter")
        assert isinstance(app.screen, TraceScreen) and app.screen.session_id == "nav-s1"
        await pilot.press("escape")
        assert isinstance(app.screen, ProgramsScreen)


async def test_pause_then_resume_reaches_the_daemon(daemon: DaemonProcess) -> None:
    make_program(daemon, "act-p1", "act-s1")
    app = tui(daemon)
    async with app.run_test(size=SIZE) as pilot:
        table = await select_program(pilot, "act-p1")
        cursor = table.cursor_coordinate
        await pilot.press("p")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await until(pilot, lambda: program(daemon, "act-p1")["held"] is True, "pause")
        assert program(daemon, "act-p1")["status"] == "PAUSED"
        await until(pilot, lambda: table.get_cell("act-p1", "status") == "PAUSED",
                    "the row to show PAUSED")
        assert table.cursor_coordinate == cursor  # updated in place

        await pilot.press("r", "n")  # declined: nothing is sent
        await pilot.pause(0.3)
        assert program(daemon, "act-p1")["held"] is True
        await pilot.press("r", "y")
        await until(pilot, lambda: program(daemon, "act-p1")["held"] is False, "resume")


async def test_read_only_sends_nothing(daemon: DaemonProcess) -> None:
    make_program(daemon, "ro-p1", "ro-s1")
    app = tui(daemon, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await select_program(pilot, "ro-p1")
        await pilot.press("x", "y", "m")
        assert isinstance(app.screen, ProgramsScreen)
        await pilot.pause(0.3)
        assert program(daemon, "ro-p1")["status"] != "FAILED"


async def test_migrate_from_the_trace_and_export(daemon: DaemonProcess, tmp_path: Path,
                                                 shots: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_program(daemon, "mig-p1", "mig-s1")
    source = program(daemon, "mig-p1")["worker_id"]
    target = "local-sim-1" if source == "local-sim-0" else "local-sim-0"
    app = tui(daemon)
    async with app.run_test(size=SIZE) as pilot:
        await select_program(pilot, "mig-p1")
        await pilot.press("t")
        screen = app.screen
        assert isinstance(screen, TraceScreen)
        timeline = screen.query_one(TraceTimeline)
        await until(pilot, lambda: any(s.kind == "generate" for s in timeline.spans),
                    "the request's spans")

        await pilot.press("m")
        modal = app.screen
        assert isinstance(modal, MigrateModal)
        options = modal.query_one(OptionList)
        options.highlighted = next(i for i, w in enumerate(modal.targets) if w["id"] == target)
        await pilot.press("enter")
        await until(pilot, lambda: any(s.kind == "migrate" and s.worker_id == target
                                       for s in timeline.spans), "the migration in the trace")
        assert program(daemon, "mig-p1")["worker_id"] == target
        assert program(daemon, "mig-p1")["pinned"] is True

        await pilot.press("end", "enter")
        details = str(screen.query_one("#span-details").render())
        assert "migrate of program mig-p1" in details and target in details
        assert "mig-p1" in svg_text(app, shots, "tui-trace.svg")

        await pilot.press("e")
        await until(pilot, lambda: screen.last_export is not None, "the export")
        assert screen.last_export is not None and screen.last_export.parent == tmp_path
        exported = json.loads(screen.last_export.read_text())
        assert any(e["kind"] == "program.migrated" for e in exported["data"])


async def test_error_bar_shows_and_clears_across_a_restart(daemon_factory: Any) -> None:
    d = daemon_factory(workers=1).start()
    app = tui(d)
    async with app.run_test(size=SIZE) as pilot:
        bar = app.screen.query_one(ErrorBar)
        await until(pilot, lambda: app.snapshot is not None, "first poll")
        assert not bar.visible_error
        d.stop()
        await until(pilot, lambda: bar.visible_error, "the error bar")
        assert "cannot reach" in str(bar.render())
        d.start()
        await until(pilot, lambda: not bar.visible_error, "the error bar to clear", 20)


def test_top_once_prints_one_summary(daemon: DaemonProcess,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    make_program(daemon, "top-p1", "top-s1")
    parser = argparse.ArgumentParser(prog="agentctl")
    add_tui_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["top", "--once"])
    with AgentdClient(daemon.url, daemon.token) as client:
        assert args.tui_command(client, args) == 0
    out = capsys.readouterr().out
    assert f"agentd at {daemon.url}: ok" in out
    assert "engine: sim (simulated)" in out
    assert "top-p1" in out and "top-s1" in out
    assert "\x1b[" not in out  # --once prints plain text, no screen clearing
