"""Shared by the web UI tests: a real daemon, a logged-in HTTP client, form helpers."""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from markupsafe import escape

from tests.daemon_process import DaemonProcess

MODEL = "sim-llama3-8b"


def require_ui(d: DaemonProcess) -> None:
    if httpx.get(f"{d.url}/ui/login", timeout=10).status_code == 404:
        pytest.fail("the daemon serves no /ui: daemon/app.py must mount "
                    "webui.create_ui_router(config.base_url) in create_app()")


def run_program(d: DaemonProcess, program_id: str, session_id: str,
                max_tokens: int = 8) -> None:
    """One chat request tagged with a program and a session: the program stays ACTING."""
    r = d.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}]},
        headers={"X-Program-Id": program_id, "X-Session-Id": session_id})
    assert r.status_code == 200, r.text


def esc(text: str) -> str:
    return str(escape(text))


def text_of(page: str) -> str:
    """The page's text without its tags (what a reader sees, entities still escaped)."""
    return re.sub(r"<[^>]+>", "", page)


def found(pattern: str, page: str, group: int = 0) -> str:
    """What `pattern` (its `.` matching newlines too) finds in `page`, or that group of it;
    the test fails, showing the page, when it finds nothing."""
    m = re.search(pattern, page, re.S)
    assert m, page[:2000]
    return m.group(group)


def csrf_of(page: str) -> str:
    m = re.search(r'name="_csrf" value="([^"]+)"', page)
    assert m, page[:2000]
    return m.group(1)


def ui_client(d: DaemonProcess) -> httpx.Client:
    return httpx.Client(base_url=d.url, timeout=30, follow_redirects=False)


def login(d: DaemonProcess, token: str | None = None) -> httpx.Client:
    c = ui_client(d)
    page = c.get("/ui/login")
    assert page.status_code == 200
    r = c.post("/ui/login", data={"_csrf": csrf_of(page.text), "token": token or d.token,
                                  "next": "/ui/"})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/ui/"
    return c


def submit(c: httpx.Client, page_path: str, to: str, **fields: str) -> httpx.Response:
    """POST a form to `to` the way the browser does: with the CSRF token of the page it
    is on, coming back to that page."""
    page = c.get(page_path)
    assert page.status_code == 200, page.text[:500]
    return c.post(to, data={"_csrf": csrf_of(page.text), "next": page_path, **fields})


def flash_of(c: httpx.Client, path: str) -> str:
    page = c.get(path).text
    m = re.search(r'<p class="flash flash-(ok|error)" role="status">([^<]*)</p>', page)
    assert m, f"no flash on {path}"
    return f"{m.group(1)}: {m.group(2)}"


def sse_events(c: httpx.Client, path: str, until: Any, timeout: float = 30) -> list[
        tuple[str, Any]]:
    """(event, data) pairs from a /ui stream until `until(event, data)` holds."""
    got: list[tuple[str, Any]] = []
    started = time.monotonic()
    with c.stream("GET", path, timeout=timeout) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        event = "message"
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                got.append((event, json.loads(line.split(":", 1)[1])))
                if until(event, got[-1][1]):
                    return got
            assert time.monotonic() - started < timeout, got[-3:]
    return got


def api_json(d: DaemonProcess, path: str) -> Any:
    r = d.get(path)
    assert r.status_code == 200, r.text
    return r.json()


def program(d: DaemonProcess, program_id: str) -> dict[str, Any]:
    return dict(api_json(d, f"/v1/programs/{quote(program_id, safe='')}"))
