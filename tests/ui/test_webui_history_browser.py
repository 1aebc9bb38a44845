"""The overview shows the daemon's stored history on arrival, after a restart, in a real
browser (Chromium through Playwright, against a real `agentd start` with the sim engine):
charts drawn from /v1/history in the first HTML the server sends, the events panel with
a worker's crash, the alert line saying so, the range selector; and the bulk release of
idle programs behind its confirmation, not offered to a read-only token.

Skipped when Chromium or Playwright is missing, unless AGENTD_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.test_webui_browser import browser, log_in, publish  # noqa: F401  (a fixture)
from tests.ui.webui_support import require_ui
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MODEL = "sim-llama3-8b"
ENV = {"AGENTD_HISTORY_INTERVAL_S": "0.5"}


def _chat(d: DaemonProcess, program: str) -> None:
    r = d.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Program-Id": program, "X-Session-Id": f"s-{program}"})
    assert r.status_code == 200, r.text


def _kinds(d: DaemonProcess) -> set[str]:
    return {e["kind"] for e in d.get("/v1/events?limit=1000").json()["data"]}


def _served(d: DaemonProcess) -> bool:
    body = d.get("/v1/history?series=requests_per_s&since=-600&step=1").json()
    return any(v > 0 for s in body["series"] for _, v in s["points"])


def _points(page_html: str, line: str) -> list[tuple[float, float]]:
    """The (x, y) points of a chart's line as the server drew it (y 80 is zero)."""
    m = re.search(rf'data-line="{re.escape(line)}" points="([^"]*)"', page_html)
    pairs = [p.split(",") for p in m.group(1).split()] if m else []
    return [(float(x), float(y)) for x, y in pairs]


def test_the_overview_shows_history_and_events_on_arrival_after_a_restart(
        browser: Any, tmp_path: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    shots = (Path(os.environ["AGENTD_ARTIFACTS"]) if os.environ.get("AGENTD_ARTIFACTS")
             else tmp_path) / "webui-history"
    shots.mkdir(parents=True, exist_ok=True)
    d = DaemonProcess(data_dir=tmp_path / "data", env=ENV).start()
    try:
        require_ui(d)
        for n in range(6):
            _chat(d, f"hist-{n}")
        worker = d.get("/v1/workers").json()["data"][0]
        os.kill(worker["pid"], signal.SIGKILL)  # the supervisor restarts it
        wait_for(lambda: "worker.exited" in _kinds(d) and _served(d), 30,
                 lambda: f"the crash event and a sample with requests: {_kinds(d)}")
        d.stop()
        d = DaemonProcess(data_dir=d.data_dir, port=d.port, env=ENV).start()

        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(15_000)
        log_in(page, d)
        # on arrival: the server's first HTML already holds the lines from before the restart
        first = page.goto(f"{d.url}/ui/")
        assert first is not None and first.status == 200
        html = first.text()
        # requests ran only before the restart: a point above zero is from then
        assert any(y < 79 for _, y in _points(html, "requests_per_s")), "no requests on arrival"
        assert _points(html, "ttft_p99_s"), "no TTFT chart on arrival"
        assert _points(html, f"kv_used_pct {worker['id']}")
        assert re.search(r"worker \S+ process exited with -9", html), "no crash event"
        assert "daemon stopped" in html
        # the alert line says a worker crashed lately, though it is healthy again now
        expect(page.locator("#alerts")).to_contain_text(re.compile(r"process exited.*min ago"))
        events = page.locator("#events tbody tr")
        assert events.count() >= 3
        expect(page.locator("#live")).to_have_text(re.compile(r"^Live, updated"))
        expect(page.locator('#events tr:has-text("worker.exited")')).to_have_count(1)
        page.screenshot(path=str(shots / "01-overview-history.png"), full_page=True)
        publish(shots / "01-overview-history.png", "webui-overview-history.png")

        # the range selector: the last day reads the minute tier (and its raw tail)
        page.get_by_role("navigation", name="Chart range").get_by_role("link", name="day").click()
        page.wait_for_url(re.compile(r".*/ui/\?range=day$"))
        lines = page.locator('figure[data-chart="requests"] polyline[data-line="requests_per_s"]')
        assert len((lines.get_attribute("points") or "").split()) >= 1
        assert page.locator("figure[data-chart] .chart-since").first.inner_text() == "\u221224 h"

        release_idle_behind_a_confirmation(page, d, shots)
        page.close()
    finally:
        d.stop()


def release_idle_behind_a_confirmation(page: Any, d: DaemonProcess, shots: Path) -> None:
    from playwright.sync_api import expect

    for p in ("idle-a", "idle-b"):
        _chat(d, p)
    page.goto(f"{d.url}/ui/programs")
    page.get_by_label("Programs idle for at least").fill("0")
    page.get_by_role("button", name="Release idle programs…").click()
    dialog = page.get_by_role("alertdialog")
    expect(dialog).to_contain_text(re.compile(r"Release \d+ program\(s\)\?"))
    for p in ("idle-a", "idle-b"):
        expect(dialog.locator(f'tr[data-program="{p}"]')).to_have_count(1)
        assert d.get(f"/v1/programs/{p}").json()["status"] not in ("STOPPED", "FAILED")
    page.screenshot(path=str(shots / "02-release-idle-confirm.png"), full_page=True)
    dialog.get_by_role("button", name=re.compile(r"^Release \d+ program")).click()
    page.wait_for_url(re.compile(r".*/ui/programs$"))
    expect(page.locator(".flash")).to_contain_text("released")
    for p in ("idle-a", "idle-b"):
        assert d.get(f"/v1/programs/{p}").json()["status"] == "STOPPED"

    # a read-only token is not offered the button (the API would refuse it anyway)
    done = d.cli("token", "create", "--scope", "read", "--name", "viewer")
    assert done.returncode == 0, done.stderr
    page.locator("form.logout button").click()
    page.goto(f"{d.url}/ui/login")
    page.get_by_label("API token").fill(done.stdout.strip())
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{d.url}/ui/")
    assert page.locator("#release-idle-form").count() == 0
    page.goto(f"{d.url}/ui/programs")
    assert page.locator("#release-idle-form").count() == 0
