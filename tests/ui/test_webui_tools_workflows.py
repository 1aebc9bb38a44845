"""Tools, workflows and runs in the web UI, against a real daemon with sim workers:
tool resources and reclaiming orphans, submitting a run from the form, following its
events live, its futures graph and managed state on the session page, cancelling."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from console.workflow_cmd import read_bundle
from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import (
    api_json,
    esc,
    flash_of,
    found,
    require_ui,
    run_program,
    sse_events,
    submit,
    text_of,
)
from tools.base import Owner
from tools.process_backend import ProcessBackend
from tools.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
# a run that lasts as long as it is told (the tests cancel it, or let it end at once)
SLEEPER = "import time\n\n\ndef main(seconds: float = 60):\n    time.sleep(seconds)\n"


def tool_config(tmp: Path) -> Path:
    path = tmp / "agentd.toml"
    path.write_text('[tools.shell]\nbackend = "process"\ncommand = []\nexec_timeout_s = 10\n')
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("webui-wf")
    d = DaemonProcess(data_dir=tmp / "data", workers=1,
                      extra_args=["--config", str(tool_config(tmp))])
    d.start()
    try:
        require_ui(d)
        for name, files in (("analyst", read_bundle(ROOT / "examples" / "analyst")),
                            ("sleeper", {"main.py": SLEEPER})):
            r = d.post("/v1/workflows", json={"name": name, "files": files,
                                              "entry": "main:main"})
            assert r.status_code == 201, r.text
        yield d
    finally:
        d.stop()


def runs(d: DaemonProcess) -> list[dict[str, Any]]:
    return list(api_json(d, "/v1/runs")["data"])


# --- tools -------------------------------------------------------------------------------


def make_orphan(d: DaemonProcess, program_id: str) -> None:
    """A tool directory of this daemon whose program it does not know (as a crash leaves)."""
    daemon_id = (d.data_dir / "daemon_id").read_text().strip()
    spec = parse_spec({"name": "shell", "backend": "process"})
    asyncio.run(ProcessBackend(d.data_dir / "tools").create(
        Owner(daemon_id, program_id, "shell"), spec))


def tool_owners(d: DaemonProcess) -> set[str]:
    return {r["program_id"] for r in api_json(d, "/v1/tools")["data"]
            if r.get("resource") != "error"}


def test_tools_page_lists_owners_and_reclaims_orphans(daemon: DaemonProcess,
                                                      ui: httpx.Client) -> None:
    run_program(daemon, "tool-live", "tool-s")
    r = daemon.post("/v1/programs/tool-live/tools/shell/exec", json={"command": "echo hi > f"})
    assert r.status_code == 200, r.text
    orphan = "<b>gone-program</b>"
    make_orphan(daemon, orphan)
    assert {"tool-live", orphan} <= tool_owners(daemon)

    page = ui.get("/ui/tools").text
    rows = {m.group(1): m.group(0) for m in re.finditer(
        r'<tr data-program="([^"]*)">.*?</tr>', page, re.S)}
    assert "tool-live" in rows and esc(orphan) in rows and "<b>gone" not in page
    assert ">shell<" in rows["tool-live"] and ">process<" in rows["tool-live"]
    assert re.search(r"\d+(\.\d)? (B|KiB|MiB)", rows["tool-live"])  # its disk
    assert re.search(r"\d+ resource\(s\) of \d+ program\(s\)", text_of(page))
    owner = found(r'<tr data-owner="tool-live">.*?</tr>', page)
    assert '<td class="num">1</td>' in owner

    preview = ui.get("/ui/tools", params={"preview": "1"}).text
    table = found(r'<table id="reclaim-preview">.*?</table>', preview)
    assert esc(orphan) in table and "tool-live" not in table
    assert orphan in tool_owners(daemon)  # a preview removes nothing

    assert ui.post("/ui/actions/tools/reclaim", data={}).status_code == 403
    assert orphan in tool_owners(daemon)
    r = submit(ui, "/ui/tools", "/ui/actions/tools/reclaim")
    assert r.status_code == 303 and r.headers["location"] == "/ui/tools"
    assert re.match(r"ok: reclaimed 1 resource\(s\), .* of " + re.escape(esc(orphan)),
                    flash_of(ui, "/ui/tools"))
    owners = tool_owners(daemon)
    assert orphan not in owners and "tool-live" in owners


# --- workflows and runs ------------------------------------------------------------------


def test_workflows_page_lists_bundles_and_runs(daemon: DaemonProcess,
                                               ui: httpx.Client) -> None:
    page = ui.get("/ui/workflows").text
    row = found(r'<tr data-workflow="analyst">.*?</tr>', page)
    assert "<code>ticker</code> (required)" in row and "<code>main:main</code>" in row
    assert '<option value="sleeper"' in page and 'for="run-args"' in page


def test_submit_a_run_follow_it_live_and_see_its_futures(daemon: DaemonProcess,
                                                         ui: httpx.Client) -> None:
    r = submit(ui, "/ui/workflows", "/ui/actions/run", form_id="run-submit",
               workflow="analyst", version="", session_id="ui-run-s",
               args='{"ticker": "ACME"}', limits='{"timeout_s": 120}')
    assert r.status_code == 303, r.text
    location = r.headers["location"]
    run_id = found(r"^/ui/run\?id=(run-[0-9a-f]+)$", location, 1)
    events = sse_events(ui, f"/ui/run/events?id={run_id}", lambda e, _: e == "done")
    kinds = [data["kind"] for event, data in events if event == "run-event"]
    assert kinds[0] == "run.created" and kinds[-1] == "run.finished"
    assert kinds.count("future.created") == 5 and kinds.count("future.resolved") == 5
    assert events[-1][1]["status"] == "finished"
    assert events[-1][1]["result"]["summary"].startswith("ACME: stock:")

    page = ui.get(location).text
    assert f"started run {run_id} of analyst v1" in page  # the flash
    assert 'id="run-status" class="badge run-finished"' in page
    assert "ACME: stock:" in page and "data-follow" not in page  # ended: nothing to follow
    shown = re.findall(r'<tr><td class="num">[\d.]+ s</td><td class="kind">([\w.]+)</td>', page)
    assert shown[:len(kinds)] == kinds  # an ended run's page lists what the stream sent
    assert runs(daemon)[0]["limits"]["timeout_s"] == 120

    session = ui.get("/ui/session", params={"id": "ui-run-s"}).text
    graph = found(r'<svg id="futures".*?</svg>', session)
    assert graph.count('class="future f-done"') == 5
    assert graph.count('<path class="dep"') == 5  # market_data -> 2 agents, 3 -> summary
    assert "Summariser.summarise waits for StockAgent.analyse" in graph
    state = re.search(r'<dl class="state" id="managed-state">.*?</dl>', session, re.S)
    assert state and "analyst_reports" in state.group(0) and "ACME: stock:" in state.group(0)
    assert f'href="/ui/run?id={run_id}"' in session


def test_a_live_run_page_follows_and_can_be_cancelled(daemon: DaemonProcess,
                                                      ui: httpx.Client) -> None:
    r = submit(ui, "/ui/workflows", "/ui/actions/run", form_id="run-submit",
               workflow="sleeper", args='{"seconds": 60}')
    run_id = r.headers["location"].split("=", 1)[1]
    page = ui.get(r.headers["location"]).text
    assert f'data-follow="/ui/run/events?id={run_id}"' in page
    assert f'aria-label="cancel run {run_id}"' in page and 'src="/ui/static/run.js"' in page

    assert ui.post("/ui/actions/run/cancel", data={"id": run_id}).status_code == 403
    assert api_json(daemon, f"/v1/runs/{run_id}")["status"] in ("starting", "running")
    r = submit(ui, f"/ui/run?id={run_id}", "/ui/actions/run/cancel", id=run_id)
    assert r.status_code == 303
    assert flash_of(ui, f"/ui/run?id={run_id}") == f"ok: cancelled run {run_id} (now cancelled)"
    assert api_json(daemon, f"/v1/runs/{run_id}")["status"] == "cancelled"
    done = sse_events(ui, f"/ui/run/events?id={run_id}", lambda e, _: e == "done")
    assert done[-1][1]["status"] == "cancelled"


def test_run_form_refusals_keep_the_input(daemon: DaemonProcess, ui: httpx.Client) -> None:
    before = len(runs(daemon))
    submit(ui, "/ui/workflows", "/ui/actions/run", form_id="run-submit", workflow="analyst",
           args='{"ticker": <oops>')
    page = ui.get("/ui/workflows").text
    assert "start a run of analyst failed: args: not valid JSON" in page
    assert esc('{"ticker": <oops>') in page  # back in the form, escaped
    submit(ui, "/ui/workflows", "/ui/actions/run", form_id="run-submit", workflow="analyst",
           args='{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "args: nested too deeply" in flash_of(ui, "/ui/workflows")
    submit(ui, "/ui/workflows", "/ui/actions/run", form_id="run-submit", workflow="analyst",
           args="{}")
    assert "ticker" in flash_of(ui, "/ui/workflows")  # the API names the missing argument
    submit(ui, "/ui/workflows", "/ui/actions/run", form_id="run-submit", workflow="analyst",
           args='{"ticker": "X"}', limits='{"memory_mb": 1}')
    assert "memory_mb" in flash_of(ui, "/ui/workflows")
    r = ui.post("/ui/actions/run", data={"workflow": "analyst", "args": '{"ticker": "X"}'})
    assert r.status_code == 403  # answered: a run it had started would be listed now
    assert len(runs(daemon)) == before


def test_runs_filter_by_status(daemon: DaemonProcess, ui: httpx.Client) -> None:
    r = daemon.post("/v1/runs", json={"workflow": "sleeper", "args": {"seconds": 0}})
    run_id = r.json()["id"]
    assert daemon.run_ended(run_id, 30)["status"] == "finished"
    finished = ui.get("/ui/workflows", params={"status": "finished"}).text
    assert f'data-run="{run_id}"' in finished and "run-cancelled" not in finished
    cancelled = ui.get("/ui/workflows", params={"status": "cancelled"}).text
    assert f'data-run="{run_id}"' not in cancelled
    assert quote(run_id) in ui.get("/ui/workflows").text
