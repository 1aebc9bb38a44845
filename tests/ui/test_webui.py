"""The web UI under /ui, against a real `agentd start` process with sim workers.

Every page goes through the UI's login, and every number it shows comes from the
daemon's REST API, so these tests drive the UI over HTTP and check its effects through
the API itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import (
    MODEL,
    csrf_of,
    esc,
    found,
    login,
    program,
    require_ui,
    run_program,
    sse_events,
    text_of,
    ui_client,
)

HOSTILE_PROGRAM = "<script>alert('p')</script>"
HOSTILE_SESSION = "s\"><img src=x onerror=alert(1)>"
ACTIONS = ("/ui/actions/program", "/ui/actions/session", "/ui/actions/policy",
           "/ui/actions/tools/reclaim", "/ui/actions/run", "/ui/actions/run/cancel")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("webui") / "data", workers=2)
    d.start()
    try:
        require_ui(d)
        yield d
    finally:
        d.stop()


# --- login -------------------------------------------------------------------------------


def test_every_page_needs_a_login(daemon: DaemonProcess) -> None:
    with ui_client(daemon) as c:
        for path in ("/ui/", "/ui/programs?status=ACTING", "/ui/sessions",
                     "/ui/session?id=s1", "/ui/policies", "/ui/policy?name=agentd",
                     "/ui/policy/diff?name=agentd&from=1&to=1", "/ui/tools",
                     "/ui/workflows", "/ui/run?id=r1"):
            r = c.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"].startswith("/ui/login?next=/ui"), r.headers
        for stream in ("/ui/events", "/ui/programs/live", "/ui/run/events?id=r1"):
            assert c.get(stream).status_code == 401, stream
        # Actions refuse without a session too (the CSRF check comes first).
        for action in ACTIONS:
            r = c.post(action, data={"id": "p", "action": "kill", "name": "agentd"})
            assert r.status_code == 403, action


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
    for chart in ("throughput", "requests", "errors", "ttft", "tpot", "kv", "queue"):
        assert f'data-chart="{chart}"' in over.text
    assert 'id="events"' in over.text  # the events panel
    active = re.search(r'<ul id="active-policies".*?</ul>', over.text, re.S)
    assert active and 'data-policy="agentd"' in active.group(0)  # the config's kv policy

    progs = ui.get("/ui/programs", params={"status": "ACTING", "sort": "id", "dir": "asc"})
    assert progs.status_code == 200 and "render-p1" in progs.text
    assert 'aria-sort="ascending"' in progs.text
    assert 'data-live="/ui/programs/live?status=ACTING' in progs.text
    assert ui.get("/ui/programs", params={"status": "STOPPED"}).text.count("render-p1") == 0
    assert ui.get("/ui/programs", params={"page": 2}).status_code == 200

    sess = ui.get("/ui/sessions", params={"sort": "programs"})
    assert sess.status_code == 200 and "render-s1" in sess.text

    one = ui.get("/ui/session", params={"id": "render-s1"})
    assert one.status_code == 200
    assert "<svg" in one.text and 'class="span s-prefill"' in one.text
    assert 'class="span s-decode"' in one.text and "TTFT" in one.text
    assert 'class="span s-queue"' in one.text and "<title>" in one.text
    assert 'class="marker m-decision"' in one.text  # the kv policy admitted the request
    assert 'name="worker_id"' in one.text and 'for="session-worker"' in one.text
    assert "No futures recorded" in one.text and "holds no managed state" in one.text
    zoomed = ui.get("/ui/session", params={"id": "render-s1", "zoom": 4})
    widths = [int(found(r'<svg id="timeline"[^>]* width="(\d+)"', page.text, 1))
              for page in (one, zoomed)]
    assert widths[1] > 3 * widths[0] // 2 and 'aria-current="true">4\u00d7' in zoomed.text

    for path in ("/ui/policies", "/ui/tools", "/ui/workflows", "/ui/policy?name=agentd"):
        r = ui.get(path)
        assert r.status_code == 200, (path, r.text[:500])
    assert ui.get("/ui/session", params={"id": "no-such"}).status_code == 404
    assert ui.get("/ui/policy", params={"name": "no-such"}).status_code == 404
    assert ui.get("/ui/run", params={"id": "no-such"}).status_code == 404
    for asset in ("/ui/static/ui.css", "/ui/static/live.js", "/ui/static/editor.js",
                  "/ui/static/run.js"):
        assert ui.get(asset).status_code == 200, asset


def test_every_form_field_has_a_label(daemon: DaemonProcess, ui: httpx.Client) -> None:
    run_program(daemon, "label-p", "label-s")
    for path in ("/ui/programs", "/ui/sessions", "/ui/session?id=label-s", "/ui/policies",
                 "/ui/policy?name=agentd", "/ui/tools", "/ui/workflows"):
        page = ui.get(path).text
        labelled = set(re.findall(r'<label for="([^"]+)"', page))
        fields = re.findall(r'<(?:input|select|textarea)\b(?![^>]*type="(?:hidden|checkbox)")'
                            r'[^>]*\bid="([^"]+)"', page)
        assert fields or path == "/ui/tools", path
        assert set(fields) <= labelled, (path, set(fields) - labelled)
        assert '<a class="skip" href="#main">' in page and 'aria-label="Main"' in page


def test_programs_paginate_and_sort(daemon: DaemonProcess, ui: httpx.Client) -> None:
    for i in range(27):
        run_program(daemon, f"page-p{i:02d}", "page-s", max_tokens=1)
    first = ui.get("/ui/programs", params={"session": "page-s"}).text
    assert "Page 1 of 2 (27 in all)" in text_of(first)
    second = ui.get("/ui/programs", params={"session": "page-s", "page": 2}).text
    assert "Page 2 of 2" in text_of(second)
    shown = set(re.findall(r"page-p\d\d", first)) | set(re.findall(r"page-p\d\d", second))
    assert len(shown) == 27
    ascending = ui.get("/ui/programs", params={"session": "page-s", "sort": "id",
                                               "dir": "asc"}).text
    ids = re.findall(r'<tr data-program="(page-p\d\d)">', ascending)
    assert ids == sorted(ids) and ids[0] == "page-p00" and len(ids) == 25


def test_sessions_filter_by_tenant_and_id(daemon: DaemonProcess, ui: httpx.Client) -> None:
    for sid in ("filt-alpha", "filt-beta", "other-gamma"):
        run_program(daemon, f"{sid}-p", sid, max_tokens=1)
    found = ui.get("/ui/sessions", params={"q": "FILT-"}).text
    assert "filt-alpha" in found and "filt-beta" in found and "other-gamma" not in found
    assert "(2 in all)" in text_of(found)
    assert "No sessions match" in ui.get("/ui/sessions", params={"tenant": "nobody"}).text
    # the session's tenant is its creator's (a token without a tenant is its own)
    tenant = daemon.get("/v1/sessions/filt-alpha").json()["tenant"]
    assert "filt-alpha" in ui.get("/ui/sessions", params={"tenant": tenant,
                                                         "q": "alpha"}).text


def test_hostile_ids_are_refused_and_escaped(daemon: DaemonProcess, ui: httpx.Client) -> None:
    """Ids with markup never get into the store (the gateway's id alphabet); pages that
    echo what a user typed (an unknown session, a search) escape it."""
    r = daemon.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Program-Id": HOSTILE_PROGRAM})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Program-Id", r.text
    pages = [ui.get("/ui/session", params={"id": HOSTILE_SESSION}).text,
             ui.get("/ui/sessions", params={"q": HOSTILE_PROGRAM}).text,
             ui.get("/ui/programs", params={"session": HOSTILE_SESSION}).text]
    for page in pages:
        assert "<script>alert" not in page
        assert "<img src=x" not in page
    assert esc(HOSTILE_SESSION) in pages[0]
    assert esc(HOSTILE_PROGRAM) in pages[1]


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
    run_program(daemon, "ro-p", "ro-s")
    # A viewer of the session's tenant: another tenant's token would not see it at all.
    tenant = daemon.get("/v1/sessions/ro-s").json()["tenant"]
    made = daemon.cli("token", "create", "--scope", "read", "--name", "viewer",
                      "--tenant", tenant)
    assert made.returncode == 0, made.stderr
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
    sent: list[bool] = []

    def until(event: str, snap: dict[str, Any]) -> bool:
        if event == "snapshot" and not sent:
            sent.append(True)
            run_program(daemon, "sse-p", "sse-s")  # shows up in a later snapshot
        return any(p["id"] == "sse-p" for p in snap.get("programs", []))

    snaps = [snap for event, snap in sse_events(ui, "/ui/events", until, timeout=15)
             if event == "snapshot"]
    first, last = snaps[0], snaps[-1]
    assert {w["engine"] for w in first["workers"]} == {"sim (simulated)"}
    assert first["alerts"] == [] and len(snaps) >= 2
    assert {"name": "agentd", "layer": "kv", "version": 1} in last["policies"]
    charts = {c["key"]: c for c in last["charts"]}  # from the stored history (/v1/history)
    assert set(charts) == {"throughput", "requests", "errors", "ttft", "tpot", "kv", "queue"}
    assert all(re.fullmatch(r"[\d., -]*", ln["points"])
               for c in charts.values() for ln in c["lines"])
    assert last["range"] == "hour" and isinstance(last["events"], list)


def test_programs_live_feed_follows_status(daemon: DaemonProcess, ui: httpx.Client) -> None:
    run_program(daemon, "feed-p", "feed-s")
    released: list[bool] = []

    def until(event: str, data: dict[str, Any]) -> bool:
        assert event == "programs", data
        [row] = data["rows"]
        if not released:
            assert row["id"] == "feed-p" and row["status"] == "ACTING"
            released.append(daemon.post("/v1/programs/feed-p/release").status_code == 200)
        return bool(row["status"] == "STOPPED")

    got = sse_events(ui, "/ui/programs/live?session=feed-s&all=1", until, timeout=15)
    assert released == [True] and len(got) >= 2
    assert got[-1][1]["total"] == 1


def test_static_files_hold_no_remote_references() -> None:
    root = Path(__file__).resolve().parents[2] / "webui"
    for f in [*(root / "static").iterdir(), *(root / "templates").iterdir()]:
        text = f.read_text()
        assert "http://" not in text and "https://" not in text, f
        assert "innerHTML" not in text, f
