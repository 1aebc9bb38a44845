"""In a real browser (Chromium through Playwright, against a real `agentd start` with a sim
worker): a session whose tenant traces content shows its conversation, token totals and
export links; its program page shows the program's totals and requests; a request page
shows the stored prompt and completion, redacted. With AGENTD_UPDATE_SCREENSHOTS=1 the
session and program pages are written to docs/screenshots/ (the README shows them).

Skipped when Chromium or Playwright is missing, unless AGENTD_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.test_webui_browser import browser, log_in, publish, shots  # noqa: F401
from tests.ui.webui_support import require_ui

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MODEL = "sim-llama3-8b"


def test_a_session_with_content_and_its_program_page(browser: Any, tmp_path: Path,  # noqa: F811
                                                     shots: Path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    cfg = tmp_path / "agentd.toml"
    cfg.write_text("content_tracing = true\n\n[prices.sim-llama3-8b]\n"
                   "prompt_per_mtok = 0.5\ncompletion_per_mtok = 1.5\n")
    d = DaemonProcess(data_dir=tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        require_ui(d)
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0)
        history = [{"role": "system", "content": "You fix failing tests."},
                   {"role": "user", "content": "test_parse fails; my key is "
                                               "sk-abcdefghijklmnopqrstuvwx"}]
        for step in range(3):
            out = client.chat.completions.create(
                model=MODEL, messages=history, max_tokens=12,  # type: ignore[arg-type]
                extra_body={"program_id": "fixer", "session_id": "fix-session"})
            history += [{"role": "assistant", "content": out.choices[0].message.content or ""},
                        {"role": "user", "content": f"tool output {step}: 3 passed"}]
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(15_000)
        log_in(page, d)

        page.goto(f"{d.url}/ui/session?id=fix-session")
        conversation = page.locator("#session-contents")
        expect(conversation).to_contain_text("tool output 1: 3 passed")
        expect(page.locator("#session-usage")).to_contain_text("3 request(s)")
        expect(page.locator("#session-usage")).to_contain_text("cost")
        assert "sk-abcdefghijklmnopqrstuvwx" not in page.content()  # redacted before storing
        expect(page.get_by_role("link", name="Perfetto")).to_have_count(1)
        page.screenshot(path=str(shots / "session-content.png"), full_page=True)
        publish(shots / "session-content.png", "webui-session-content.png")

        page.goto(f"{d.url}/ui/program?id=fixer")
        expect(page.locator("#program-usage")).to_contain_text("3 request(s)")
        expect(page.locator("#session-contents")).to_contain_text("tool output 1: 3 passed")
        page.screenshot(path=str(shots / "program.png"), full_page=True)
        publish(shots / "program.png", "webui-program.png")

        page.goto(f"{d.url}/ui/session?id=fix-session")
        page.locator("#session-contents a[href^='/ui/request']").first.click()
        expect(page.locator("#content-completion")).not_to_be_empty()
        expect(page.locator("#content-prompt")).to_contain_text("You fix failing tests.")
        page.close()
    finally:
        d.stop()
