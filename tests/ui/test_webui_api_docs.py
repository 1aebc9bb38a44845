"""The API reference opens with the web UI's login (a browser cannot send the bearer header
/schema/* wants) and stays closed without one; dark mode follows the system's setting; the
keyboard reaches the navigation, and "/" the page's search box.

The browser tests drive Debian's Chromium with Playwright (skipped without them, unless
AGENTD_REQUIRE_BROWSER=1), against a real `agentd start` with a sim worker.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.test_webui_browser import browser  # noqa: F401  (the Chromium fixture)
from tests.ui.webui_support import login, require_ui, ui_client
from webui.api_docs import operations

NAV = ["Overview", "Programs", "Sessions", "Policies", "Tools", "Workflows", "API"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("webui-api") / "data", workers=1)
    d.start()
    try:
        require_ui(d)
        yield d
    finally:
        d.stop()


def test_without_a_login_the_docs_stay_closed(daemon: DaemonProcess) -> None:
    c = ui_client(daemon)
    for path in ("/ui/api", "/ui/api/openapi.json"):
        r = c.get(path)
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=/ui/api")
    for path in ("/schema/openapi.json", "/schema/swagger"):
        assert httpx.get(f"{daemon.url}{path}", timeout=10).status_code == 401, path


def test_the_login_opens_the_reference_and_the_document(daemon: DaemonProcess) -> None:
    c = login(daemon)
    page = c.get("/ui/api")
    assert page.status_code == 200
    assert '<a href="/ui/api" aria-current="page">API</a>' in page.text
    schema = daemon.get("/schema/openapi.json").json()
    operations = sum(1 for item in schema["paths"].values()
                     for m in ("get", "post", "put", "patch", "delete") if m in item)
    assert page.text.count("<details data-op") == operations > 40
    # Each operation lists its parameters from the document.
    listing = re.search(r'<details data-op id="GET-v1-programs">.*?</details>', page.text, re.S)
    assert listing, page.text[:2000]
    assert re.findall(r'<td class="id">(\w+)</td><td>query</td>', listing.group(0)) == [
        p["name"] for p in schema["paths"]["/v1/programs"]["get"]["parameters"]]
    document = c.get("/ui/api/openapi.json")
    assert document.status_code == 200 and document.json() == schema


def log_in(page: Any, d: DaemonProcess) -> None:
    page.goto(f"{d.url}/ui/api")
    page.fill("#token", d.token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{d.url}/ui/api")


def test_tab_reaches_the_navigation_and_slash_the_search(
        browser: Any, daemon: DaemonProcess) -> None:  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(15_000)
    log_in(page, daemon)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    reached = []
    for _ in NAV:
        page.keyboard.press("Tab")
        reached.append(page.evaluate("document.activeElement.textContent"))
    assert reached == NAV
    # The focused link is drawn with an outline (focus-visible), not left invisible.
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")
    # "/" from anywhere but a field jumps to the search box, which filters operations.
    page.locator("main").focus()
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "api-filter"
    page.keyboard.type("release")
    shown = page.locator("details[data-op]:visible")
    assert shown.count() >= 1
    assert all("release" in t.lower() for t in shown.all_text_contents())
    assert shown.count() < page.locator("details[data-op]").count()
    # An operation opens from the keyboard: Tab to its summary, Enter.
    page.locator("details[data-op]:visible summary").first.focus()
    page.keyboard.press("Enter")
    assert page.locator("details[data-op][open]").count() == 1
    page.close()


def background_of(chromium: Any, d: DaemonProcess, scheme: str) -> tuple[int, ...]:
    context = chromium.new_context(color_scheme=scheme)
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        log_in(page, d)
        colour = page.evaluate("getComputedStyle(document.body).backgroundColor")
        return tuple(int(v) for v in re.findall(r"\d+", colour)[:3])
    finally:
        context.close()


def test_dark_mode_follows_the_system(browser: Any, daemon: DaemonProcess) -> None:  # noqa: F811
    dark = background_of(browser, daemon, "dark")
    light = background_of(browser, daemon, "light")
    assert max(dark) < 60, dark
    assert min(light) > 200, light


def test_a_request_body_lists_its_fields() -> None:
    schema = {"paths": {"/v1/things": {"post": {
        "summary": "make a thing",
        "requestBody": {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Thing"}}}},
        "responses": {"201": {}, "400": {}}}}},
        "components": {"schemas": {"Thing": {
            "required": ["name"],
            "properties": {"name": {"type": "string", "description": "what it is called"},
                           "tags": {"type": "array", "items": {"type": "string"}},
                           "owner": {"oneOf": [{"$ref": "#/components/schemas/User"},
                                               {"type": "null"}]}}}}}}
    [op] = operations(schema)["/v1/things"]
    assert (op.method, op.body, op.responses, op.anchor) == ("POST", "Thing", ["201", "400"],
                                                             "POST-v1-things")
    assert [(f.name, f.where, f.type, f.required, f.description) for f in op.fields] == [
        ("name", "body", "string", True, "what it is called"),
        ("tags", "body", "array of string", False, ""),
        ("owner", "body", "User | null", False, "")]
