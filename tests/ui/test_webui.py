"""The web UI under /ui, against a real `agentd start` process with sim workers.

Every page goes through the UI's login, and every number it shows comes from the
daemon's REST API, so these tests drive the UI over HTTP and check its effects through
the API itself.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from markupsafe import escape

from tests.daemon_process import DaemonProcess
from webui.timeline import layout

MODEL = "sim-llama3-8b"
HOSTILE_PROGRAM = "<script>alert('p')</script>"
HOSTILE_SESSION = "s\"><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("webui") / "data", workers=2)
    d.start()
    try:
        require_ui(d)
        yield d
    finally:
        d.stop()


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


def _esc(text: str) -> str:
    return str(escape(text))


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


@pytest.fixture
def ui(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    c = login(daemon)
    yield c
    c.close()


def program(d: DaemonProcess, program_id: str) -> dict[str, object]:
    r = d.get(f"/v1/programs/{quote(program_id, safe='')}")
    assert r.status_code == 200, r.text
    return dict(r.json())


# --- login -------------------------------------------------------------------------------


def test_every_page_needs_a_login(daemon: DaemonProcess) -> None:
    with ui_client(daemon) as c:
        for path in ("/ui/", "/ui/programs?status=ACTING", "/ui/sessions",
                     "/ui/session?id=s1"):
            r = c.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"].startswith("/ui/login?next=/ui"), r.headers
        assert c.get("/ui/events").status_code == 401
        # Actions refuse without a session too (the CSRF check comes first).
        r = c.post("/ui/actions/program", data={"id": "p", "action": "kill"})
        assert r.status_code == 403


def test_login_refuses_a_wrong_token_and_sets_a_strict_httponly_cookie(
        daemon: DaemonProcess) -> None:
    with ui_client(daemon) as c:
        page = c.get("/ui/login")
        assert 'for="token"' in page.text and 'id="token"' in page.text  # labelled field
        r = c.post("/ui/login", data={"_csrf": csrf_of(page.text), "token": "agd_wrong"})
        assert r.status_code == 401
        assert "not valid" in r.text
        assert c.get("/ui/").status_code == 303  # still logged out
        # A login without the form's CSRF token is refused even with a good token.
        r = c.post("/ui/login", data={"token": daemon.token})
        assert r.status_code == 403
        assert c.get("/ui/").status_code == 303

        page = c.get("/ui/login")
        r = c.post("/ui/login", data={"_csrf": csrf_of(page.text), "token": daemon.token,
                                      "next": "https://evil.example/"})
        assert r.status_code == 303
        assert r.headers["location"] == "/ui/"  # no open redirect
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        assert daemon.token.lower() not in cookie  # the token stays on the server
        assert c.get("/ui/").status_code == 200

        # Logging out needs the CSRF token, then ends the session.
        assert c.post("/ui/logout", data={}).status_code == 403
        assert c.get("/ui/").status_code == 200
        r = c.post("/ui/logout", data={"_csrf": csrf_of(c.get("/ui/").text)})
        assert r.status_code == 303
        assert c.get("/ui/").status_code == 303


# --- pages -------------------------------------------------------------------------------


def test_every_page_renders(daemon: DaemonProcess, ui: httpx.Client) -> None:
    run_program(daemon, "render-p1", "render-s1")
    over = ui.get("/ui/")
    assert over.status_code == 200
    assert over.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in over.headers["content-security-policy"]
    assert "sim (simulated)" in over.text
    assert "local-sim-0" in over.text and "local-sim-1" in over.text
    assert "<meter" in over.text and "render-p1" in over.text
    assert 'src="/ui/static/live.js"' in over.text

    progs = ui.get("/ui/programs", params={"status": "ACTING", "sort": "id", "dir": "asc"})
    assert progs.status_code == 200 and "render-p1" in progs.text
    assert 'aria-sort="ascending"' in progs.text
    assert ui.get("/ui/programs", params={"status": "STOPPED"}).text.count("render-p1") == 0
    assert ui.get("/ui/programs", params={"page": 2}).status_code == 200

    sess = ui.get("/ui/sessions", params={"sort": "programs"})
    assert sess.status_code == 200 and "render-s1" in sess.text

    one = ui.get("/ui/session", params={"id": "render-s1"})
    assert one.status_code == 200
    assert "<svg" in one.text and 'class="span s-generate"' in one.text
    assert 'class="span s-queue"' in one.text and "<title>" in one.text
    assert 'name="worker_id"' in one.text and 'for="session-worker"' in one.text

    assert ui.get("/ui/session", params={"id": "no-such"}).status_code == 404
    for asset in ("/ui/static/ui.css", "/ui/static/live.js"):
        assert ui.get(asset).status_code == 200, asset


def test_programs_paginate_and_sort(daemon: DaemonProcess, ui: httpx.Client) -> None:
    for i in range(27):
        run_program(daemon, f"page-p{i:02d}", "page-s", max_tokens=1)
    first = ui.get("/ui/programs", params={"session": "page-s"}).text
    assert "Page 1 of 2 (27 in all)" in first
    second = ui.get("/ui/programs", params={"session": "page-s", "page": 2}).text
    assert "Page 2 of 2" in second
    shown = set(re.findall(r"page-p\d\d", first)) | set(re.findall(r"page-p\d\d", second))
    assert len(shown) == 27
    ascending = ui.get("/ui/programs", params={"session": "page-s", "sort": "id",
                                               "dir": "asc"}).text
    ids = re.findall(r"<td>(page-p\d\d)</td>", ascending)
    assert ids == sorted(ids) and ids[0] == "page-p00" and len(ids) == 25


def test_hostile_ids_are_escaped(daemon: DaemonProcess, ui: httpx.Client) -> None:
    run_program(daemon, HOSTILE_PROGRAM, HOSTILE_SESSION)
    pages = [ui.get("/ui/").text, ui.get("/ui/programs").text, ui.get("/ui/sessions").text,
             ui.get("/ui/session", params={"id": HOSTILE_SESSION}).text]
    for page in pages:
        assert "<script>alert" not in page
        assert "<img src=x" not in page
    assert _esc(HOSTILE_PROGRAM) in pages[1]
    assert _esc(HOSTILE_SESSION) in pages[2]
    session_page = pages[3]
    assert _esc(HOSTILE_PROGRAM) in session_page  # in the table and the SVG titles
    assert "&lt;script&gt;" in session_page.split("<svg", 1)[1].split("</svg>", 1)[0]


# --- actions -----------------------------------------------------------------------------


def test_an_action_without_the_csrf_token_is_refused(daemon: DaemonProcess,
                                                      ui: httpx.Client) -> None:
    run_program(daemon, "csrf-p", "csrf-s")
    form = {"id": "csrf-p", "action": "release", "next": "/ui/session?id=csrf-s"}
    assert ui.post("/ui/actions/program", data=form).status_code == 403
    assert ui.post("/ui/actions/program", data={**form, "_csrf": "forged"}).status_code == 403
    workers = [w["id"] for w in daemon.get("/v1/workers").json()["data"]]
    r = ui.post("/ui/actions/session", data={"id": "csrf-s", "worker_id": workers[0]})
    assert r.status_code == 403
    assert program(daemon, "csrf-p")["status"] != "STOPPED"
    assert not program(daemon, "csrf-p")["pinned"]


def test_release_from_the_session_page_stops_the_program(daemon: DaemonProcess,
                                                        ui: httpx.Client) -> None:
    run_program(daemon, "rel-p", "rel-s")
    page = ui.get("/ui/session", params={"id": "rel-s"})
    assert 'aria-label="release program rel-p"' in page.text
    r = ui.post("/ui/actions/program", data={
        "_csrf": csrf_of(page.text), "id": "rel-p", "action": "release",
        "next": "/ui/session?id=rel-s"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/session?id=rel-s"
    assert program(daemon, "rel-p")["status"] == "STOPPED"
    after = ui.get("/ui/session", params={"id": "rel-s"}).text
    assert "release program rel-p: done" in after
    assert 'class="marker m-end"' in after  # the timeline shows the end


def test_migrate_moves_and_pins_the_program(daemon: DaemonProcess, ui: httpx.Client) -> None:
    run_program(daemon, "mig-p", "mig-s")
    source = program(daemon, "mig-p")["worker_id"]
    target = next(w["id"] for w in daemon.get("/v1/workers").json()["data"]
                  if w["id"] != source)
    page = ui.get("/ui/session", params={"id": "mig-s"})
    r = ui.post("/ui/actions/program", data={
        "_csrf": csrf_of(page.text), "id": "mig-p", "action": "migrate",
        "worker_id": target, "next": "/ui/session?id=mig-s"})
    assert r.status_code == 303
    moved = program(daemon, "mig-p")
    assert moved["pinned"] is True and moved["worker_id"] == target
    trace = daemon.get("/v1/sessions/mig-s/trace").json()["data"]
    assert any(e["kind"] == "program.migrated" and e["data"]["target"] == target
               for e in trace)
    after = ui.get("/ui/session", params={"id": "mig-s"}).text
    assert f"migrate program mig-p to {target}: done" in after
    assert 'class="marker m-migrate"' in after and f"-&gt; {target}" in after

    # The session-wide form, and an API refusal shown as a message, not a crash.
    r = ui.post("/ui/actions/session", data={
        "_csrf": csrf_of(after), "id": "mig-s", "worker_id": "no-such-worker",
        "next": "/ui/session?id=mig-s"})
    assert r.status_code == 303
    shown = ui.get("/ui/session", params={"id": "mig-s"}).text
    assert "migrate session mig-s failed" in shown
    assert program(daemon, "mig-p")["worker_id"] == target


def test_a_read_only_token_sees_pages_but_cannot_act(daemon: DaemonProcess) -> None:
    made = daemon.cli("token", "create", "--scope", "read", "--name", "viewer")
    assert made.returncode == 0, made.stderr
    run_program(daemon, "ro-p", "ro-s")
    c = login(daemon, made.stdout.strip())
    try:
        page = c.get("/ui/session", params={"id": "ro-s"})
        assert page.status_code == 200
        c.post("/ui/actions/program", data={"_csrf": csrf_of(page.text), "id": "ro-p",
                                            "action": "kill", "next": "/ui/session?id=ro-s"})
        shown = c.get("/ui/session", params={"id": "ro-s"}).text
        assert "kill program ro-p failed" in shown and "operator" in shown
    finally:
        c.close()
    assert program(daemon, "ro-p")["status"] != "FAILED"


# --- live updates ------------------------------------------------------------------------


def test_events_stream_json_snapshots(daemon: DaemonProcess, ui: httpx.Client) -> None:
    snaps: list[dict[str, object]] = []
    started = time.monotonic()
    with ui.stream("GET", "/ui/events") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        event = ""
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "snapshot":
                snaps.append(json.loads(line.split(":", 1)[1]))
                if len(snaps) == 1:
                    run_program(daemon, "sse-p", "sse-s")  # shows up in a later snapshot
                if any(p["id"] == "sse-p" for p in snaps[-1]["programs"]):  # type: ignore[attr-defined]
                    break
            assert time.monotonic() - started < 15
    first = snaps[0]
    engines = {w["engine"] for w in first["workers"]}  # type: ignore[attr-defined]
    assert engines == {"sim (simulated)"}
    assert first["alerts"] == []
    assert len(snaps) >= 2


# --- the timeline layout (pure) ----------------------------------------------------------


def _ev(i: int, ts: float, kind: str, **kw: object) -> dict[str, object]:
    return {"id": i, "ts": ts, "kind": kind, "program_id": kw.pop("program_id", "p"),
            "request_id": kw.pop("request_id", None), "worker_id": kw.pop("worker_id", None),
            "data": kw}


def test_timeline_layout_spans_and_markers() -> None:
    events = [
        _ev(1, 100.0, "program.created"),
        _ev(2, 100.0, "request.queued", request_id="r1"),
        _ev(3, 100.5, "request.dispatched", request_id="r1", worker_id="w0"),
        _ev(4, 101.0, "request.finished", request_id="r1", prompt_tokens=5, cached_tokens=0,
            output_tokens=9, reason="length"),
        _ev(5, 101.0, "program.status", old="ACTING", new="PAUSED", reason="thrashing"),
        _ev(6, 102.0, "program.status", old="PAUSED", new="QUEUED", reason="restored"),
        _ev(7, 102.0, "program.migrated", source="w0", target="w1", by="op"),
        _ev(8, 104.0, "program.status", old="ACTING", new="STOPPED", reason="released"),
        _ev(9, 100.2, "request.queued", program_id="q", request_id="r2"),
    ]
    t = layout(events)
    assert [lane.program_id for lane in t.lanes] == ["p", "q"]
    p = t.lanes[0]
    kinds = {s.kind: s for s in p.spans}
    assert set(kinds) == {"queue", "generate", "pause"}
    assert kinds["queue"].w == pytest.approx(kinds["pause"].w / 2, rel=0.01)
    assert kinds["generate"].x == pytest.approx(kinds["queue"].x + kinds["queue"].w)
    assert "output 9" in kinds["generate"].title and "on w0" in kinds["generate"].title
    assert "thrashing" in kinds["pause"].title
    assert [m.kind for m in p.markers] == ["migrate", "end"]
    assert "w0 -> w1" in p.markers[0].title
    # r2 never got dispatched: its queue span runs to the end of the trace.
    q = t.lanes[1].spans[0]
    assert q.kind == "queue" and q.x + q.w == pytest.approx(t.width - 10)
    assert layout([]).lanes == []


def test_static_files_hold_no_remote_references() -> None:
    root = Path(__file__).resolve().parents[2] / "webui"
    for f in [*(root / "static").iterdir(), *(root / "templates").iterdir()]:
        text = f.read_text()
        assert "http://" not in text and "https://" not in text, f
        assert "innerHTML" not in text, f
