"""`agentctl tui` and `agentctl top` against a real daemon with simulated workers.

Every action is driven by keys through Textual's Pilot and its effect is read back
from the daemon's REST API, not from the TUI's own state.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList, Static, TextArea

from console.client import AgentdClient, AsyncAgentdClient
from console.tui import add_tui_parser
from console.tui.app import VIEWS, AgentdTui
from console.tui.screens.confirm import ConfirmModal
from console.tui.screens.help import HelpModal
from console.tui.screens.migrate import MigrateModal
from console.tui.screens.overview import OverviewScreen
from console.tui.screens.policies import PoliciesScreen
from console.tui.screens.policy_editor import PolicyEditorScreen
from console.tui.screens.programs import ProgramsScreen
from console.tui.screens.sessions import SessionsScreen
from console.tui.screens.tools import ToolsScreen
from console.tui.screens.trace import TraceScreen
from console.tui.widgets.error_bar import ErrorBar
from console.tui.widgets.keyed_table import KeyedTable
from console.tui.widgets.nav_bar import VIEW_NAMES, NavBar
from console.tui.widgets.policy_pane import PolicyPane
from console.tui.widgets.policy_tables import PoliciesTable, VersionsTable
from console.tui.widgets.programs_table import ProgramsTable
from console.tui.widgets.sessions_table import SessionsTable
from console.tui.widgets.tools_table import ToolsTable
from console.tui.widgets.trace_timeline import TraceTimeline
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for, wait_for_async
from tools.base import Owner
from tools.process_backend import ProcessBackend
from tools.spec import parse_spec

SIZE = (130, 36)
MODEL = "sim-llama3-8b"
TOOLS_CONFIG = """
[tools.shell]
backend = "process"
command = []
exec_timeout_s = 10
"""


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the docs screenshots go: $AGENTD_TUI_SHOTS (docs/screenshots), else a tmp dir."""
    chosen = os.environ.get("AGENTD_TUI_SHOTS")
    path = Path(chosen).resolve() if chosen else tmp_path_factory.mktemp("screens")
    path.mkdir(parents=True, exist_ok=True)
    return path


def tools_config(directory: Path) -> Path:
    path = directory / "agentd.toml"
    path.write_text(TOOLS_CONFIG)
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("tui")
    d = DaemonProcess(tmp / "data", workers=2,
                      extra_args=["--config", str(tools_config(tmp))]).start()
    yield d
    d.stop()


def chat(d: DaemonProcess, program_id: str, session_id: str, max_tokens: int = 8) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {program_id}"}],
            "max_tokens": max_tokens, "program_id": program_id, "session_id": session_id}
    r = d.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def make_program(d: DaemonProcess, program_id: str, session_id: str) -> None:
    chat(d, program_id, session_id)


def run_tool(d: DaemonProcess, program_id: str, command: str = "echo hi > out.txt") -> None:
    r = d.post(f"/v1/programs/{program_id}/tools/shell/exec", json={"command": command})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text


def program(d: DaemonProcess, program_id: str) -> dict[str, Any]:
    r = d.get(f"/v1/programs/{program_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def policies(d: DaemonProcess) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in d.get("/v1/policies").json()["data"]}


def tool_owners(d: DaemonProcess) -> set[str]:
    return {t["program_id"] for t in d.get("/v1/tools").json()["data"] if t.get("program_id")}


def tui(d: DaemonProcess, read_only: bool = False) -> AgentdTui:
    client = AsyncAgentdClient(d.url, d.token, timeout=5.0)
    return AgentdTui(client, read_only=read_only, poll_interval=0.2)


async def until(pilot: Pilot[None], cond: Callable[[], bool], what: str | Callable[[], str],
                timeout: float = 15.0, interval: float = 0.05) -> None:
    """`wait_for` for a running app: it runs between checks."""
    await wait_for_async(cond, timeout, what, interval, pause=pilot.pause)


def text_of(app: AgentdTui, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


def svg_text(app: AgentdTui, directory: Path, name: str) -> str:
    path = Path(app.save_screenshot(filename=name, path=str(directory)))
    print(f"screenshot: {path}")
    return html.unescape(path.read_text()).replace("\xa0", " ")


async def cursor_to(pilot: Pilot[None], table: KeyedTable, key: str) -> None:
    """Move the table's cursor with the arrow keys until it is on `key`."""
    await until(pilot, lambda: key in [r.key.value for r in table.ordered_rows], f"row {key}")
    table.focus()
    await pilot.press("ctrl+home", *["down"] * table.get_row_index(key))
    await until(pilot, lambda: table.selected_id == key, f"the cursor on {key}")


async def select_program(pilot: Pilot[None], program_id: str) -> ProgramsTable:
    await pilot.press("2")
    table = pilot.app.screen.query_one(ProgramsTable)
    await until(pilot, lambda: program_id in [k.value for k in table.rows], "program row")
    await pilot.press("slash", *program_id, "enter")
    await until(pilot, lambda: table.row_count == 1 and table.selected_id == program_id,
                "the filter to leave only the program")
    return table


# --- navigation ------------------------------------------------------------------------


async def test_navigation_jump_and_help(daemon: DaemonProcess, tmp_path: Path) -> None:
    make_program(daemon, "nav-p1", "nav-s1")
    app = tui(daemon)
    assert list(VIEWS) == list(VIEW_NAMES)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.snapshot is not None, "first poll")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.pause(0.1)
        shot = svg_text(app, tmp_path, "overview.svg")
        assert "sim (simulated)" in shot and "local-sim-1" in shot and "KV USAGE" in shot
        assert "kv: agentd v1" in shot and "throughput" in shot and "no alerts" in shot

        numbered: list[tuple[str, type[Any]]] = [
            ("2", ProgramsScreen), ("3", SessionsScreen), ("4", PoliciesScreen),
            ("5", ToolsScreen), ("1", OverviewScreen)]
        for key, view in numbered:
            await pilot.press(key)
            assert isinstance(app.screen, view), key
        for name, (view, aliases) in VIEWS.items():
            for word in (name, *aliases):
                await pilot.press("1", "colon", *word, "enter")
                assert isinstance(app.screen, view), word
        await pilot.press("colon", *"nonsense", "enter")
        assert isinstance(app.screen, ToolsScreen)  # stays where it was
        nav = str(app.screen.query_one(NavBar).render())
        await pilot.click(NavBar, offset=(nav.index("3 sessions") + 2, 0))  # the mouse
        assert isinstance(app.screen, SessionsScreen)

        await pilot.press("2", "question_mark")
        assert isinstance(app.screen, HelpModal)
        keys = str(app.screen.query_one("#keys", Static).render())
        for title in ("everywhere", *VIEWS, "policy editor"):
            assert title in keys, title
        for description in ("pause", "reclaim orphans", "roll back", "store + validate",
                            "export JSON", "trace", "sort", "jump"):
            assert description in keys, description
        titles = [line for line in keys.splitlines() if not line.startswith(" ")]
        assert titles[:2] == ["everywhere", "programs"]  # the current view first
        await pilot.press("escape")

        table = app.screen.query_one(ProgramsTable)
        await until(pilot, lambda: "nav-p1" in [k.value for k in table.rows], "program row")
        assert table.get_cell("nav-p1", "session") == "nav-s1"
        await pilot.press("colon", *"trace nav-s1", "enter")
        assert isinstance(app.screen, TraceScreen) and app.screen.session_id == "nav-s1"
        await pilot.press("escape")
        assert isinstance(app.screen, ProgramsScreen)  # back where the trace was opened


async def test_programs_sort_and_status_filter(daemon: DaemonProcess) -> None:
    for n, tokens in enumerate((4, 24, 12)):
        chat(daemon, f"sort-p{n}", "sort-s", max_tokens=tokens)
    app = tui(daemon)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.screen.query_one(ProgramsTable)
        await pilot.press("slash", *"sort-p", "enter")
        await until(pilot, lambda: table.row_count == 3, "the three programs")
        await pilot.press("s", "s")  # newest → status → tokens
        assert "sort: tokens" in text_of(app, "#programs-title")
        by_tokens = sorted((program(daemon, f"sort-p{n}") for n in range(3)),
                           key=lambda p: -p["context_tokens"])
        await until(pilot, lambda: [r.key.value for r in table.ordered_rows]
                    == [p["id"] for p in by_tokens], "rows ordered by tokens")
        await pilot.press("S")
        await until(pilot, lambda: [r.key.value for r in table.ordered_rows]
                    == [p["id"] for p in reversed(by_tokens)], "rows in reverse")
        await pilot.press("f", "f", "f")  # QUEUED → REASONING → ACTING
        assert "status=ACTING" in text_of(app, "#programs-title")
        await until(pilot, lambda: table.row_count == 3, "the acting programs")
        await pilot.press("f")
        await until(pilot, lambda: table.row_count == 0, "no PAUSED program")


# --- program and session actions -------------------------------------------------------


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


async def test_release_and_kill_from_the_programs_view(daemon: DaemonProcess) -> None:
    make_program(daemon, "end-p1", "end-s1")
    make_program(daemon, "end-p2", "end-s1")
    app = tui(daemon)
    async with app.run_test(size=SIZE) as pilot:
        await select_program(pilot, "end-p1")
        await pilot.press("d", "y")
        await until(pilot, lambda: program(daemon, "end-p1")["status"] == "STOPPED", "release")
        await pilot.press("escape")
        await select_program(pilot, "end-p2")
        await pilot.press("x", "y")
        await until(pilot, lambda: program(daemon, "end-p2")["status"] == "FAILED", "kill")


async def test_read_only_sends_nothing(daemon: DaemonProcess) -> None:
    make_program(daemon, "ro-p1", "ro-s1")
    before = policies(daemon)
    app = tui(daemon, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await select_program(pilot, "ro-p1")
        await pilot.press("x", "y", "m", "d", "y", "p", "y")
        assert isinstance(app.screen, ProgramsScreen)
        await pilot.press("4")
        await until(pilot, lambda: app.screen.query_one(PoliciesTable).row_count > 0,
                    "the policies")
        await pilot.press("e", "a", "y", "b", "y", "v")
        assert isinstance(app.screen, PoliciesScreen)  # no editor, no confirmation
        await pilot.press("5", "g", "y")
        assert isinstance(app.screen, ToolsScreen)
        await pilot.pause(0.3)
        assert program(daemon, "ro-p1")["status"] == "ACTING"
        assert program(daemon, "ro-p1")["held"] is False
        assert policies(daemon) == before


async def test_migrate_from_the_trace_and_export(daemon: DaemonProcess, tmp_path: Path,
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
        await until(pilot, lambda: any(s.kind == "request" for s in timeline.spans),
                    "the request's row")

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

        index = next(i for i, s in enumerate(timeline.spans) if s.kind == "migrate")
        await pilot.press("home", *["down"] * index, "enter")
        details = text_of(app, "#span-details")
        assert "migrate of program mig-p1" in details and target in details

        await pilot.press("e")
        await until(pilot, lambda: screen.last_export is not None, "the export")
        assert screen.last_export is not None and screen.last_export.parent == tmp_path
        exported = json.loads(screen.last_export.read_text())
        assert any(e["kind"] == "program.migrated" for e in exported["data"])


HOL_SRC = '''import time

import agentd
from agentd import runtime


@agentd.agent(min_instances=2, max_instances=2)
class Worker:
    def work(self, i: int, delay: float) -> int:
        time.sleep(delay)  # a call that takes a while, so that the next ones queue
        return i


def main(n: int = 8, delay: float = 2.0) -> list[int]:
    w = Worker()
    assert w.instances == 2  # registers the agent: its local controllers report from now
    control = runtime.current().control
    while not control.snapshot()["rules"]["weights"]:
        time.sleep(0.05)  # until the test's route (every call to Worker#0) has reached us
    futures = [w.work(i, delay) for i in range(n)]
    return [int(f) for f in futures]
'''


def control_policy(d: DaemonProcess, name: str) -> None:
    r = httpx.put(f"{d.url}/v1/control/policy", json={"name": name},
                  headers=d.auth_headers(), timeout=10)
    assert r.status_code == 200 and r.json()["policy"] == name, r.text


def queued_on(d: DaemonProcess, run_id: str, instance: str) -> int:
    view = d.get(f"/v1/runs/{run_id}/control").json()
    return sum(f["executor"] == instance and f["status"] == "queued"
               for f in view.get("futures", []))


async def test_migrate_a_runs_calls_to_an_agent_instance(daemon: DaemonProcess) -> None:
    """A run's calls all wait on Worker#0 (an operator's route); the migrate modal of the
    run's session offers Worker#1 and moves them there, and the trace shows the moves."""
    control_policy(daemon, "static")  # no global policy moves calls behind the test's back
    try:
        r = daemon.post("/v1/workflows", json={"name": "tui-hol", "files": {
            "main.py": HOL_SRC}, "entry": "main:main"})
        assert r.status_code == 201, r.text
        run = daemon.post("/v1/runs", json={"workflow": "tui-hol", "session_id": "inst-s"}).json()
        # waits in a thread: the checks are blocking HTTP calls
        await asyncio.to_thread(
            wait_for, lambda: daemon.get(f"/v1/runs/{run['id']}/control").json()["reported"],
            20, "the sandbox to report its view")
        route = {"kind": "WeightedRoute", "agent_type": "Worker", "instances": ["Worker#0"],
                 "weights": [1.0], "reason": "test: every call to one instance"}
        r = daemon.post(f"/v1/runs/{run['id']}/control/decisions", json={"decisions": [route]})
        assert r.status_code == 200 and r.json()["results"][0]["ok"], r.text
        await asyncio.to_thread(wait_for, lambda: queued_on(daemon, run["id"], "Worker#0") >= 3,
                                30, "the calls to queue on Worker#0")

        app = tui(daemon)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("colon", *"trace inst-s", "enter")
            screen = app.screen
            assert isinstance(screen, TraceScreen)
            timeline = screen.query_one(TraceTimeline)
            await pilot.press("m")
            modal = app.screen
            assert isinstance(modal, MigrateModal)
            await until(pilot, lambda: any(m.possible for m in modal.moves), lambda: (
                f"an instance offered ({modal.query_one('#instances-note', Static).render()}; "
                f"{modal.moves})"), timeout=20)
            [move] = modal.moves  # Worker#1: Worker#0 holds the calls, it is the source
            assert (move.source, move.destination, move.run_id) == (
                "Worker#0", "Worker#1", run["id"])
            assert move.waiting >= 2
            options = modal.query_one(OptionList)
            assert "Worker#1" in str(options.get_option_at_index(len(modal.targets) + 1).prompt)
            options.highlighted = len(modal.targets) + 1  # after the workers and a heading
            await pilot.press("enter")
            await until(pilot, lambda: app.last_action is not None, "the decision's answer")
            assert app.last_action is not None and app.last_action.ok, app.last_action
            await until(pilot, lambda: any(s.kind == "migrate" and s.name == "call → Worker#1"
                                           for s in timeline.spans), "a moved call in the trace")
            assert any(s.kind == "decision" and s.name == "control Migrate"
                       for s in timeline.spans)

        final = await asyncio.to_thread(daemon.run_ended, run["id"], 60)
        assert final["status"] == "finished" and final["result"] == list(range(8)), final
    finally:
        control_policy(daemon, "nalar-default")
    events = daemon.get("/v1/sessions/inst-s/trace", params={"limit": 2000}).json()["data"]
    [decision] = [e["data"] for e in events if e["kind"] == "control.decision"
                  and e["data"].get("by") == "operator" and e["data"]["decision_kind"] == "Migrate"]
    assert decision["ok"] and (decision["source"], decision["destination"]) == (
        "Worker#0", "Worker#1")
    started = {e["data"]["id"]: e["data"]["instance"] for e in events
               if e["kind"] == "future.started"}
    moved = {e["data"]["id"] for e in events if e["kind"] == "future.migrated"}
    assert moved and all(started[f] == "Worker#1" for f in moved)  # each ran where it went


async def test_sessions_view_drills_down_to_a_request(daemon: DaemonProcess) -> None:
    make_program(daemon, "sv-p1", "sv-s1")
    run_tool(daemon, "sv-p1")
    chat(daemon, "sv-p1", "sv-s1")
    app = tui(daemon)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        table = app.screen.query_one(SessionsTable)
        await cursor_to(pilot, table, "sv-s1")
        assert table.get_cell("sv-s1", "programs") == "1"
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, TraceScreen) and screen.session_id == "sv-s1"
        timeline = screen.query_one(TraceTimeline)
        await until(pilot, lambda: sum(s.kind == "request" for s in timeline.spans) == 2
                    and any(s.kind == "tool" and s.end for s in timeline.spans),
                    "both requests and the tool call")
        kinds = [s.kind for s in timeline.spans]
        assert kinds[0] == "program" and "decision" in kinds
        request = next(i for i, s in enumerate(timeline.spans) if s.kind == "request")
        await pilot.press("home", *["down"] * request, "enter")
        details = text_of(app, "#span-details")
        stored = program(daemon, "sv-p1")["requests"][0]
        assert f"request {stored['id']}" in details
        assert f"prompt {stored['prompt_tokens']} (cached {stored['cached_tokens']})" in details
        assert f"output {stored['output_tokens']}" in details
        assert f"worker {stored['worker_id']}" in details and "SLO met" in details
        assert "prefill" in details and "decode" in details

        tool = next(i for i, s in enumerate(timeline.spans) if s.kind == "tool"
                    and "exec" in s.name)
        await pilot.press("home", *["down"] * tool, "enter")
        assert "shell exec" in text_of(app, "#span-details")
        assert "exit_code=0" in text_of(app, "#span-details")
        await pilot.press("escape")
        assert isinstance(app.screen, SessionsScreen)


# --- policies --------------------------------------------------------------------------


CANARY = '''\
from scheduling.kv.baselines import StickyPolicy


class Canary(StickyPolicy):
    name = "canary"
'''


async def test_policy_edit_validate_activate_rollback(daemon: DaemonProcess) -> None:
    r = await asyncio.to_thread(httpx.put, f"{daemon.url}/v1/policies/canary",
                                headers=daemon.auth_headers(),
                                json={"layer": "kv", "source": CANARY}, timeout=30)
    assert r.status_code == 201 and r.json()["validation"]["ok"], r.text
    app = tui(daemon)
    before = [p for p in policies(daemon).values() if p["active"]]
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, PoliciesScreen)
        await cursor_to(pilot, screen.query_one(PoliciesTable), "canary")
        await until(pilot, lambda: (screen.version or {}).get("name") == "canary",
                    "canary's source")
        assert screen.query_one("#policy-source", TextArea).text == CANARY

        await pilot.press("e")
        editor = app.screen
        assert isinstance(editor, PolicyEditorScreen)
        await pilot.press(*"import", "space", *"os", "enter", "ctrl+s")
        await until(pilot, lambda: editor.stored is not None, "the first store")
        assert editor.stored is not None and editor.stored["version"] == 2
        report = text_of(app, "#editor-report")
        assert "FAILED" in report and "line 1:" in report
        assert editor.query_one(TextArea).selection.start == (0, 0)  # on the bad line
        stored = daemon.get("/v1/policies/canary/versions/2").json()
        assert stored["validation"]["ok"] is False
        assert stored["validation"]["errors"][0]["line"] == 1
        await pilot.press("f5")
        assert isinstance(app.screen, PolicyEditorScreen)  # a failed version is not offered

        # the bad line is selected: typing replaces it
        await pilot.press("number_sign", "space", *"tuned", "ctrl+s")
        await until(pilot, lambda: (editor.stored or {}).get("version") == 3, "the second store")
        assert "validation: ok" in text_of(app, "#editor-report")
        assert daemon.get("/v1/policies/canary/versions/3").json()["validation"]["ok"] is True
        await pilot.press("f5")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await until(pilot, lambda: policies(daemon)["canary"]["active_version"] == 3,
                    "canary v3 active in the daemon")
        assert [p["name"] for p in policies(daemon).values()
                if p["active"] and p["layer"] == "kv"] == ["canary"]

        await pilot.press("escape")
        assert app.screen_stack[-1] is screen
        versions = screen.query_one(VersionsTable)
        await until(pilot, lambda: versions.row_count == 3, "the new history")
        await cursor_to(pilot, versions, "3")
        await pilot.press("d")
        pane = screen.query_one(PolicyPane)
        await until(pilot, lambda: pane.showing_diff and "+# tuned" in pane.diff_text,
                    "the diff v2 → v3")
        assert "-import os" in pane.diff_text
        assert daemon.get("/v1/policies/canary/versions/3").json()["source"] == (
            "# tuned\n" + CANARY)

        await cursor_to(pilot, versions, "2")
        checked = daemon.get("/v1/policies/canary/versions/2").json()["validation"]
        await pilot.press("v")
        await until(pilot, lambda: daemon.get("/v1/policies/canary/versions/2").json()
                    ["validation"]["checked_at"] > checked["checked_at"], "revalidation")
        await until(pilot, lambda: "line 1:" in text_of(app, "#policy-report"),
                    "the report inline")

        await pilot.press("b")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await until(pilot, lambda: policies(daemon)["canary"]["active_version"] is None,
                    "the rollback")
        after = [p for p in policies(daemon).values() if p["active"]]
        assert [(p["name"], p["active_version"]) for p in after] == [
            (p["name"], p["active_version"]) for p in before]
        assert daemon.get("/v1/policies/canary/versions/3").json()["status"] == "rolled_back"

        await pilot.press("1")
        await until(pilot, lambda: "policy canary v3 rolled back" in text_of(app, "#alerts"),
                    "the rollback alert")


# --- tools -----------------------------------------------------------------------------


async def test_tools_view_reclaims_orphans_and_releases(daemon_factory: Any,
                                                        tmp_path: Path) -> None:
    # a fresh daemon: its own 60 s sweep must not reclaim the orphan before the TUI does
    d = daemon_factory(workers=1, extra_args=["--config", str(tools_config(tmp_path))]).start()
    chat(d, "tl-live", "tl-s")
    run_tool(d, "tl-live")
    daemon_id = (d.data_dir / "daemon_id").read_text().strip()
    spec = parse_spec({"name": "shell", "backend": "process"}, trusted=True)
    await ProcessBackend(d.data_dir / "tools").create(Owner(daemon_id, "tl-gone", "shell"), spec)
    assert tool_owners(d) == {"tl-live", "tl-gone"}

    app = tui(d)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        table = app.screen.query_one(ToolsTable)
        await until(pilot, lambda: table.row_count == 2, "both tool directories")
        statuses = {str(table.get_row(k)[0]): str(table.get_row(k)[1]) for k in table.rows}
        assert statuses == {"tl-live": "ACTING", "tl-gone": "-"}

        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the reclaim plan")
        question = str(app.screen.query_one("#question", Static).render())
        assert "tl-gone" in question and "tl-live" not in question
        await pilot.press("y")
        await until(pilot, lambda: app.last_action is not None, "the reclaim")
        assert app.last_action is not None and app.last_action.ok
        assert [r["program_id"] for r in app.last_action.answer["data"]] == ["tl-gone"]
        assert tool_owners(d) == {"tl-live"}
        await until(pilot, lambda: table.row_count == 1, "the orphan's row to go")

        await cursor_to(pilot, table, table.ordered_rows[0].key.value or "")
        await pilot.press("d", "y")
        await until(pilot, lambda: program(d, "tl-live")["status"] == "STOPPED", "release")
        await until(pilot, lambda: not tool_owners(d), "the released program's tools to go")
        await until(pilot, lambda: table.row_count == 0, "the table to empty")


# --- resilience and scripts ------------------------------------------------------------


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
        await pilot.press("2")  # still usable after the restart
        await until(pilot, lambda: not app.screen.query_one(ErrorBar).visible_error,
                    "the programs view without an error")


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
    [kv] = [p for p in policies(daemon).values() if p["active"] and p["layer"] == "kv"]
    assert f"kv: {kv['name']} v{kv['active_version']}" in out
    assert "top-p1" in out and "top-s1" in out
    assert "\x1b[" not in out  # --once prints plain text, no screen clearing


class Traffic:
    """Chat steps from a few threads until stopped, so the overview has rates to show."""

    def __init__(self, d: DaemonProcess, programs: int = 4) -> None:
        self.d = d
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(f"load-{n}",), daemon=True)
                        for n in range(programs)]

    def run(self, program_id: str) -> None:
        with httpx.Client(base_url=self.d.url, headers=self.d.auth_headers(), timeout=30) as c:
            while not self.stop.is_set():
                c.post("/v1/chat/completions", json={
                    "model": MODEL, "max_tokens": 48, "program_id": program_id,
                    "session_id": "load", "messages": [{"role": "user", "content": "go " * 40}]})

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


async def test_screenshots_for_the_docs(daemon: DaemonProcess, shots: Path) -> None:
    """The overview under load and one session's trace, as SVG (docs/screenshots/)."""
    chat(daemon, "doc-plan", "doc-session", max_tokens=24)
    run_tool(daemon, "doc-plan", "ls -la; sleep 0.2")
    chat(daemon, "doc-plan", "doc-session", max_tokens=32)
    chat(daemon, "doc-review", "doc-session", max_tokens=16)
    app = tui(daemon)
    async with app.run_test(size=(140, 40)) as pilot:
        with Traffic(daemon):
            await until(pilot, lambda: len(app.rates.throughput) >= 12
                        and max(app.rates.throughput) > 0, "a few seconds of throughput", 30)
        await pilot.pause(0.3)
        overview = svg_text(app, shots, "tui-overview.svg")
        assert "throughput" in overview and "sim (simulated)" in overview

        await pilot.press("colon", *"trace doc-session", "enter")
        screen = app.screen
        assert isinstance(screen, TraceScreen)
        timeline = screen.query_one(TraceTimeline)
        await until(pilot, lambda: sum(s.kind == "request" for s in timeline.spans) == 3,
                    "the session's requests")
        worker = program(daemon, "doc-plan")["worker_id"]
        target = "local-sim-1" if worker == "local-sim-0" else "local-sim-0"
        await pilot.press("m")
        modal = app.screen
        assert isinstance(modal, MigrateModal)
        modal.query_one(OptionList).highlighted = next(
            i for i, w in enumerate(modal.targets) if w["id"] == target)
        await pilot.press("enter")
        await until(pilot, lambda: any(s.kind == "migrate" for s in timeline.spans),
                    "the migration")
        chat(daemon, "doc-plan", "doc-session", max_tokens=24)
        await until(pilot, lambda: sum(s.kind == "request" for s in timeline.spans) == 4,
                    "the request after the migration")
        request = next(i for i, s in enumerate(timeline.spans) if s.kind == "request")
        await pilot.press("home", *["down"] * request, "enter")
        await pilot.pause(0.2)
        trace = svg_text(app, shots, "tui-session-trace.svg")
        assert "doc-plan" in trace and "SLO met" in trace and "migrate" in trace
