"""End to end in a real browser: Debian's Chromium driven by Playwright, against a real
`agentd start` with sim workers. Log in, watch a program appear live (SSE), open its
session trace, migrate it. Screenshots go to the test's tmp dir.

Skipped when Chromium or Playwright is missing, unless AGENTD_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.test_webui import require_ui

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MODEL = "sim-llama3-8b"
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


def test_login_watch_live_open_trace_and_migrate(browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    shots = tmp_path / "screenshots"
    shots.mkdir()
    d = DaemonProcess(data_dir=tmp_path / "data", workers=2).start()
    try:
        require_ui(d)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(15_000)

        # Login: any page sends us to the login form, which returns us there after.
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
        expect(page.locator("#live")).to_have_text(re.compile(r"^Live, updated"))
        assert page.locator("#workers td.engine").first.inner_text() == "sim (simulated)"
        page.screenshot(path=str(shots / "1-overview.png"), full_page=True)

        # A program appears on the overview without a reload, pushed by SSE.
        page.evaluate("window.__sameDocument = true")
        r = d.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": "hello from the browser test"}]},
            headers={"X-Program-Id": "browser-p1", "X-Session-Id": "browser-s1"})
        assert r.status_code == 200, r.text
        row = page.locator('#live-programs tr[data-program="browser-p1"]')
        row.wait_for()
        assert page.evaluate("window.__sameDocument") is True
        page.screenshot(path=str(shots / "2-program-live.png"), full_page=True)

        # Its session: the trace as an SVG timeline with hover titles.
        row.get_by_role("link", name="browser-s1").click()
        page.wait_for_url("**/ui/session?id=browser-s1")
        spans = page.locator("svg#timeline rect.s-generate")
        assert spans.count() >= 1
        assert "browser-p1" in spans.first.locator("title").text_content()
        page.screenshot(path=str(shots / "3-session-trace.png"), full_page=True)

        # Migrate it to the other worker.
        source = d.get("/v1/programs/browser-p1").json()["worker_id"]
        target = next(w["id"] for w in d.get("/v1/workers").json()["data"]
                      if w["id"] != source)
        prog = page.locator('#session-programs tr[data-program="browser-p1"]')
        prog.get_by_label("Target worker").select_option(target)
        prog.get_by_role("button", name="migrate program browser-p1").click()
        page.get_by_text(f"migrate program browser-p1 to {target}: done").wait_for()
        moved = d.get("/v1/programs/browser-p1").json()
        assert moved["worker_id"] == target and moved["pinned"] is True
        assert page.locator("svg#timeline path.m-migrate").count() == 1
        page.screenshot(path=str(shots / "4-migrated.png"), full_page=True)

        # A narrow window: nothing but the scroll boxes scrolls sideways.
        page.set_viewport_size({"width": 380, "height": 800})
        page.goto(f"{d.url}/ui/")
        expect(page.locator("#live")).to_have_text(re.compile(r"^Live, updated"))
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        page.screenshot(path=str(shots / "5-narrow.png"), full_page=True)
        page.close()
    finally:
        d.stop()
    saved = sorted(p.name for p in shots.iterdir())
    print(f"screenshots in {shots}: {saved}")
    assert len(saved) == 5
