"""End to end in a real browser: Debian's Chromium driven by Playwright, against a real
`agentd start` with sim workers. Log in, watch a program appear live (SSE), open its
session trace, migrate it; start a workflow run from the form and follow it live, see
its futures graph; write, validate, activate and roll back a policy; the tools page;
a narrow window. Then every detail page (session, program, request, worker, run) for
objects in every state (live, STOPPED, FAILED, let go by the daemon) and after a restart.

Screenshots are test artifacts: they go to $AGENTD_ARTIFACTS/webui (CI uploads that
folder) or the test's tmp dir. With AGENTD_UPDATE_SCREENSHOTS=1 the overview and the
session page are also written to docs/screenshots/.

Skipped when Chromium or Playwright is missing, unless AGENTD_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.workflow_cmd import read_bundle
from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import require_ui
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MODEL = "sim-llama3-8b"
ROOT = Path(__file__).resolve().parents[2]
CANARY = '''from scheduling.kv.baselines import StickyPolicy


class Canary(StickyPolicy):
    name = "e2e-canary"
'''
CHROMIUM = os.environ.get("AGENTD_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def _need(reason: str) -> None:
    if os.environ.get("AGENTD_REQUIRE_BROWSER") == "1":
        pytest.fail(f"AGENTD_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("Playwright for Python is not installed (pip install playwright)")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        _need(f"Chromium not found at {CHROMIUM} (apt-get install -y chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        print(f"browser: {CHROMIUM} {b.version}")
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    base = Path(os.environ["AGENTD_ARTIFACTS"]) if os.environ.get("AGENTD_ARTIFACTS") \
        else tmp_path
    out = base / "webui"
    out.mkdir(parents=True, exist_ok=True)
    return out


def publish(shot: Path, name: str) -> None:
    """Refresh a screenshot the README shows, when asked to."""
    if os.environ.get("AGENTD_UPDATE_SCREENSHOTS") == "1":
        docs = ROOT / "docs" / "screenshots"
        docs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, docs / name)


class Traffic:
    """A few programs' requests in the background, so the overview's charts have data."""

    def __init__(self, d: DaemonProcess) -> None:
        self.d = d
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            self.d.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 24,
                "messages": [{"role": "user", "content": f"background request {n}"}]},
                headers={"X-Program-Id": f"bg-p{n % 4}", "X-Session-Id": "background"})

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def no_sideways_scroll(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


def test_the_dashboard_end_to_end(browser: Any, tmp_path: Path, shots: Path) -> None:
    # the charts read the daemon's stored history: a sample a second, so they fill quickly
    d = DaemonProcess(data_dir=tmp_path / "data", workers=2,
                      env={"AGENTD_HISTORY_INTERVAL_S": "1"}).start()
    try:
        require_ui(d)
        r = d.post("/v1/workflows", json={"name": "analyst", "entry": "main:main",
                                          "files": read_bundle(ROOT / "examples" / "analyst")})
        assert r.status_code == 201, r.text
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        log_in_by_keyboard(page, d)
        watch_a_program_appear_then_migrate_it(page, d, shots)
        run_a_workflow_and_follow_it(page, d, shots)
        edit_validate_activate_and_roll_back_a_policy(page, d, shots)
        the_tools_page(page, d, shots)
        a_narrow_window(page, d, shots)
        page.close()
    finally:
        d.stop()
    saved = sorted(p.name for p in shots.iterdir())
    print(f"screenshots in {shots}: {saved}")
    assert len(saved) == 11


def log_in_by_keyboard(page: Any, d: DaemonProcess) -> None:
    # Any page sends us to the login form, which returns us there after.
    page.goto(f"{d.url}/ui/programs")
    assert page.url.startswith(f"{d.url}/ui/login")
    # By keyboard alone: the labelled token field has the focus; Enter submits.
    assert page.evaluate("document.activeElement.id") == "token"
    assert page.get_by_label("API token").count() == 1
    page.keyboard.type(d.token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{d.url}/ui/programs")
    page.keyboard.press("Tab")  # the first stop on a page is the skip link
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")  # then the navigation
    assert page.evaluate("document.activeElement.textContent") == "Overview"
    page.keyboard.press("Enter")
    page.wait_for_url(f"{d.url}/ui/")


def watch_a_program_appear_then_migrate_it(page: Any, d: DaemonProcess, shots: Path) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#live")).to_have_text(re.compile(r"^Live, updated"))
    assert page.locator("#workers td.engine").first.inner_text() == "sim (simulated)"
    expect(page.locator("#active-policies li")).to_have_count(
        len([p for p in d.get("/v1/policies").json()["data"] if p["active"]]))

    # A program appears on the overview without a reload, pushed by SSE; the charts fill.
    page.evaluate("window.__sameDocument = true")
    with Traffic(d):
        r = d.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": "hello from the browser test"}]},
            headers={"X-Program-Id": "browser-p1", "X-Session-Id": "browser-s1"})
        assert r.status_code == 200, r.text
        row = page.locator('#live-programs tr[data-program="browser-p1"]')
        row.wait_for()
        expect(page.locator('figure[data-chart="throughput"] .chart-last')).not_to_have_text(
            re.compile(r"^(no data in this range|tokens_per_s 0 tokens/s)$"), timeout=20_000)
        # a few more samples, pushed over SSE: a line, not a dot (the last hour's chart
        # holds a point per 12 s)
        line = page.locator('figure[data-chart="throughput"] polyline')
        wait_for(lambda: len((line.get_attribute("points") or "").split()) >= 3, 60,
                 "three points on the throughput chart")
    assert page.evaluate("window.__sameDocument") is True
    page.screenshot(path=str(shots / "01-overview.png"), full_page=True)
    publish(shots / "01-overview.png", "webui-overview.png")

    # Its session: the trace as an SVG timeline with hover titles, shapes reachable by Tab.
    row.get_by_role("link", name="browser-s1").click()
    page.wait_for_url("**/ui/session?id=browser-s1")
    spans = page.locator("svg#timeline rect.s-decode")
    assert spans.count() >= 1
    assert "browser-p1" in spans.first.locator("title").text_content()
    assert page.locator("svg#timeline [tabindex='0']").count() >= 3
    page.screenshot(path=str(shots / "02-session-trace.png"), full_page=True)

    # Migrate it to the other worker.
    source = d.get("/v1/programs/browser-p1").json()["worker_id"]
    target = next(w["id"] for w in d.get("/v1/workers").json()["data"] if w["id"] != source)
    prog = page.locator('#session-programs tr[data-program="browser-p1"]')
    prog.get_by_label("Target worker").select_option(target)
    prog.get_by_role("button", name="migrate program browser-p1").click()
    page.get_by_text(f"migrate program browser-p1 to {target}: done").wait_for()
    moved = d.get("/v1/programs/browser-p1").json()
    assert moved["worker_id"] == target and moved["pinned"] is True
    assert page.locator("svg#timeline path.m-migrate").count() == 1
    # The programs table follows the program's status live: release it over the API.
    assert d.post("/v1/programs/browser-p1/release").status_code == 200
    page.locator('#session-programs tr[data-program="browser-p1"] td[data-field="status"]',
                 has_text="STOPPED").wait_for()
    page.screenshot(path=str(shots / "03-migrated.png"), full_page=True)

    # The programs table is rebuilt live too: a new program shows up without a reload.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Programs").click()
    page.wait_for_url("**/ui/programs")
    expect(page.locator("#live")).to_have_text(re.compile(r"^Live, updated"))
    r = d.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "more"}]},
        headers={"X-Program-Id": "browser-p2", "X-Session-Id": "browser-s2"})
    assert r.status_code == 200, r.text
    page.locator('#programs tr[data-program="browser-p2"]').wait_for()


def run_a_workflow_and_follow_it(page: Any, d: DaemonProcess, shots: Path) -> None:
    from playwright.sync_api import expect

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Workflows").click()
    page.wait_for_url("**/ui/workflows")
    page.get_by_label("Workflow", exact=True).select_option("analyst")
    page.get_by_label("Session").fill("browser-analyst")
    page.get_by_label("Arguments (JSON object)").fill('{"ticker": "ACME"}')
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url(re.compile(r".*/ui/run\?id=run-"))
    # Events arrive over SSE as the run goes; the outcome replaces the placeholder.
    expect(page.locator("#run-status")).to_have_text("finished", timeout=30_000)
    expect(page.locator("#run-outcome pre")).to_contain_text("ACME: stock:")
    kinds = page.locator("#run-events tbody tr td:nth-child(2)").all_text_contents()
    assert kinds[0] == "run.created" and "run.finished" in kinds
    assert kinds.count("future.created") == 5
    page.screenshot(path=str(shots / "04-run.png"), full_page=True)

    page.get_by_role("link", name="browser-analyst").click()
    page.wait_for_url("**/ui/session?id=browser-analyst")
    expect(page.locator("svg#futures g.future")).to_have_count(5)
    assert page.locator("svg#futures path.dep").count() == 5
    expect(page.locator("#managed-state")).to_contain_text("analyst_reports")
    page.locator("svg#futures g.future").first.focus()
    page.screenshot(path=str(shots / "05-session-futures.png"), full_page=True)
    publish(shots / "05-session-futures.png", "webui-session.png")


def edit_validate_activate_and_roll_back_a_policy(page: Any, d: DaemonProcess,
                                                  shots: Path) -> None:
    from playwright.sync_api import expect

    before = [(p["name"], p["active_version"]) for p in d.get("/v1/policies").json()["data"]
              if p["layer"] == "kv" and p["active"]]
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Policies").click()
    page.wait_for_url("**/ui/policies")
    page.get_by_label("Name", exact=True).fill("e2e-canary")
    page.get_by_label("Layer", exact=True).select_option("kv")
    page.get_by_label("Source", exact=True).fill(CANARY)
    page.get_by_role("button", name="Save and validate").click()
    page.wait_for_url(re.compile(r".*/ui/policy\?name=e2e-canary&v=1#report"))
    expect(page.locator("#validation-report")).to_contain_text("Valid")

    # Edit in the editor: the gutter follows the lines typed.
    editor = page.get_by_label("Source of the new version")
    editor.click()
    page.keyboard.press("Control+End")
    page.keyboard.type("\n# tuned in the browser\n")
    lines = editor.input_value().count("\n") + 1
    assert page.locator(".editor .gutter").text_content().split() == [
        str(i) for i in range(1, lines + 1)]
    expect(page.locator("#source-pos")).to_contain_text(f"Line {lines}")
    page.get_by_role("button", name="Save as new version and validate").click()
    page.wait_for_url(re.compile(r".*/ui/policy\?name=e2e-canary&v=2#report"))
    expect(page.locator(".flash")).to_contain_text("saved e2e-canary v2 (not active yet)")
    page.screenshot(path=str(shots / "06-policy-edited.png"), full_page=True)

    page.get_by_role("button", name="Show side by side").click()
    page.wait_for_url("**/ui/policy/diff?**")
    expect(page.locator("#diff tr.d-add")).to_contain_text(["# tuned in the browser"])
    page.screenshot(path=str(shots / "07-policy-diff.png"), full_page=True)
    page.go_back()

    page.get_by_role("button", name="activate e2e-canary v2").click()
    expect(page.locator(".flash")).to_contain_text("activated e2e-canary v2")
    active = [(p["name"], p["active_version"]) for p in d.get("/v1/policies").json()["data"]
              if p["layer"] == "kv" and p["active"]]
    assert active == [("e2e-canary", 2)]
    expect(page.locator("#active-version")).to_have_text("v2")
    page.screenshot(path=str(shots / "08-policy-active.png"), full_page=True)

    page.get_by_role("button", name=re.compile("roll back policy e2e-canary")).click()
    expect(page.locator(".flash")).to_contain_text("rolled back e2e-canary v2")
    after = [(p["name"], p["active_version"]) for p in d.get("/v1/policies").json()["data"]
             if p["layer"] == "kv" and p["active"]]
    assert after == before


def the_tools_page(page: Any, d: DaemonProcess, shots: Path) -> None:
    from playwright.sync_api import expect

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Tools").click()
    page.wait_for_url("**/ui/tools")
    expect(page.locator("#tool-summary")).to_contain_text("resource(s)")
    page.get_by_role("link", name="Preview what would be reclaimed").click()
    page.locator("#reclaim-preview").wait_for()
    page.get_by_role("button", name="Reclaim now").click()
    expect(page.locator(".flash")).to_contain_text("reclaimed")
    page.screenshot(path=str(shots / "09-tools.png"), full_page=True)


def a_narrow_window(page: Any, d: DaemonProcess, shots: Path) -> None:
    """A phone-sized window: nothing but the scroll boxes scrolls sideways."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 380, "height": 800})
    page.goto(f"{d.url}/ui/")
    expect(page.locator("#live")).to_have_text(re.compile(r"^Live, updated"))
    assert no_sideways_scroll(page)
    page.screenshot(path=str(shots / "10-narrow-overview.png"), full_page=True)
    for path in ("/ui/session?id=browser-analyst", "/ui/policy?name=e2e-canary",
                 "/ui/workflows", "/ui/tools", "/ui/programs", "/ui/sessions",
                 "/ui/policy/diff?name=e2e-canary&from=1&to=2"):
        page.goto(f"{d.url}{path}")
        assert no_sideways_scroll(page), path
    page.goto(f"{d.url}/ui/policy?name=e2e-canary")
    page.screenshot(path=str(shots / "11-narrow-policy.png"), full_page=True)


# --- every page for every object in every state, a restart included ---------------------


def test_every_page_opens_in_every_state_and_after_a_restart(browser: Any,
                                                              tmp_path: Path) -> None:
    """Sessions, programs, requests, runs and workers: live, STOPPED, FAILED, let go by
    the daemon, and read back from the store after a restart (with one worker fewer, so
    one worker is known only from the requests it ran). No page may answer 5xx."""
    # Its own folder: the end-to-end test counts the screenshots in its own.
    shots = (Path(os.environ["AGENTD_ARTIFACTS"]) if os.environ.get("AGENTD_ARTIFACTS")
             else tmp_path) / "webui-drilldown"
    shots.mkdir(parents=True, exist_ok=True)
    d = DaemonProcess(data_dir=tmp_path / "data", workers=2).start()
    try:
        require_ui(d)
        made = make_programs_in_every_state(d)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)
        failures: list[str] = []

        def note_failure(response: Any) -> None:
            if response.status >= 500:
                failures.append(f"{response.status} {response.url}")

        page.on("response", note_failure)
        log_in(page, d)
        walk_every_page(page, d, made, live="bw-live", restarted=False)
        page.goto(f"{d.url}/ui/program?id=bw-live")
        page.screenshot(path=str(shots / "01-program-live.png"), full_page=True)
        publish(shots / "01-program-live.png", "webui-program.png")
        d.stop()
        d = DaemonProcess(data_dir=d.data_dir, port=d.port, workers=1).start()
        log_in(page, d)  # the UI's sessions do not outlive the daemon
        walk_every_page(page, d, made, live=None, restarted=True)
        page.screenshot(path=str(shots / "02-run-program-after-restart.png"), full_page=True)
        page.close()
        assert failures == []
    finally:
        d.stop()


def make_programs_in_every_state(d: DaemonProcess) -> dict[str, Any]:
    """A session with a live, a STOPPED and a FAILED program, the ended two let go by the
    daemon; the live one's second request ran on worker local-sim-1 (the restart drops
    that worker); a finished workflow run in its own session."""
    def chat(program_id: str) -> None:
        r = d.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Program-Id": program_id, "X-Session-Id": "bw-s"})
        assert r.status_code == 200, r.text

    for p in ("bw-live", "bw-stopped", "bw-failed"):
        chat(p)
    r = d.post("/v1/programs/bw-live/migrate", json={"worker_id": "local-sim-1"})
    assert r.status_code == 200, r.text
    chat("bw-live")
    assert d.post("/v1/programs/bw-stopped/release").json()["status"] == "STOPPED"
    assert d.post("/v1/programs/bw-failed/kill").json()["status"] == "FAILED"
    def let_go(program_id: str) -> bool:  # only the stored row has no `held`
        return "held" not in d.get(f"/v1/programs/{program_id}").json()

    for p in ("bw-stopped", "bw-failed"):
        wait_for(functools.partial(let_go, p), 60, f"the daemon to let {p} go")
    r = d.post("/v1/workflows", json={"name": "analyst", "entry": "main:main",
                                      "files": read_bundle(ROOT / "examples" / "analyst")})
    assert r.status_code == 201, r.text
    run = d.run_to_end({"workflow": "analyst", "session_id": "bw-analyst",
                        "args": {"ticker": "ACME"}})
    assert run["status"] == "finished", run
    moved = d.get("/v1/programs/bw-live").json()["requests"][-1]
    assert moved["worker_id"] == "local-sim-1", moved
    return {"run": run, "moved_request": moved["id"]}


def log_in(page: Any, d: DaemonProcess) -> None:
    page.goto(f"{d.url}/ui/login")
    page.get_by_label("API token").fill(d.token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{d.url}/ui/")


def walk_every_page(page: Any, d: DaemonProcess, made: dict[str, Any], live: str | None,
                    restarted: bool) -> None:
    from playwright.sync_api import expect

    def opened(path: str) -> None:
        response = page.goto(f"{d.url}{path}")
        assert response is not None and response.status == 200, (path, response.status)

    statuses = {p: d.get(f"/v1/programs/{p}").json()["status"]
                for p in ("bw-live", "bw-stopped", "bw-failed")}
    assert statuses["bw-stopped"] == "STOPPED" and statuses["bw-failed"] == "FAILED"

    # The session holds programs in every status, each row linking to its program page.
    opened("/ui/session?id=bw-s")
    for program_id, status in statuses.items():
        row = page.locator(f'#session-programs tr[data-program="{program_id}"]')
        expect(row.locator('td[data-field="status"]')).to_contain_text(status)
    if live is not None:
        expect(page.get_by_role("button", name=f"release program {live}")).to_have_count(1)

    # Each program's page, reached by its link; its request's page, then its worker's.
    for program_id, status in statuses.items():
        opened("/ui/session?id=bw-s")
        page.locator(f'#session-programs tr[data-program="{program_id}"]').get_by_role(
            "link", name=program_id).click()
        page.wait_for_url(f"**/ui/program?id={program_id}")
        expect(page.locator("#program-status")).to_contain_text(status)
        expect(page.locator("#program-source")).to_have_text(
            re.compile("^Live" if program_id == live else "^On record"))
        first = page.locator("#program-requests tbody tr").first
        request_id = first.get_attribute("data-request")
        first.get_by_role("link", name=request_id).click()
        page.wait_for_url("**/ui/request?id=*")
        expect(page.locator("h1")).to_contain_text(request_id)
        expect(page.locator("#request-facts")).to_contain_text(program_id)

    # The worker the restart dropped: known from the requests it ran.
    opened(f"/ui/request?id={made['moved_request']}")
    page.locator("#request-facts").get_by_role("link", name="local-sim-1").click()
    page.wait_for_url("**/ui/worker?id=local-sim-1")
    expect(page.locator("#worker-source")).to_have_text(
        re.compile("^On record" if restarted else "^Live"))
    expect(page.locator(f'#worker-requests tr[data-request="{made["moved_request"]}"]')
           ).to_have_count(1)

    # A finished run: its page, its Session link, its Program link.
    run = made["run"]
    opened(f"/ui/run?id={run['id']}")
    expect(page.locator("#run-status")).to_have_text("finished")
    page.get_by_role("link", name="bw-analyst").click()
    page.wait_for_url("**/ui/session?id=bw-analyst")
    expect(page.locator("svg#futures g.future")).to_have_count(5)
    expect(page.locator(f'#session-programs tr[data-program="{run["program_id"]}"]')
           ).to_contain_text("STOPPED")
    opened(f"/ui/run?id={run['id']}")
    page.get_by_role("link", name=run["program_id"]).click()
    page.wait_for_url("**/ui/program?id=*")
    expect(page.locator("#program-facts")).to_contain_text(run["id"])
