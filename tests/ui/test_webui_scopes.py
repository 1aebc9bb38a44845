"""The web UI offers only the actions the logged-in token's scopes allow: a read-only
token sees every page and no action button or form (the API would refuse each one); a
submit token sees what 'submit' allows and nothing that needs 'operator'."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import login, program, require_ui, run_program
from tests.waiting import wait_for

# A run that stays running until it is cancelled (the test cancels it).
SLEEPER = """import time


def main() -> None:
    time.sleep(120)
"""
SESSION = "sc-s"
# Every form that changes something posts to /ui/actions/...; logging out is the one
# other form a page has.
ACTION_FORM = re.compile(r'<form method="post" action="/ui/actions/')


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("webui-sc") / "data", workers=1)
    d.start()
    try:
        require_ui(d)
        run_program(d, "sc-live", SESSION)
        run_program(d, "sc-ended", SESSION)
        assert d.post("/v1/programs/sc-ended/release").status_code == 200
        r = d.post("/v1/workflows", json={"name": "sleeper", "entry": "main:main",
                                          "files": {"main.py": SLEEPER}})
        assert r.status_code == 201, r.text
        yield d
    finally:
        d.stop()


def _client(d: DaemonProcess, scope: str) -> httpx.Client:
    tenant = d.get(f"/v1/sessions/{SESSION}").json()["tenant"]  # so it sees the session
    made = d.cli("token", "create", "--scope", scope, "--name", f"sc-{scope}",
                 "--tenant", tenant)
    assert made.returncode == 0, made.stderr
    return login(d, made.stdout.strip())


@pytest.fixture(scope="module")
def viewer(daemon: DaemonProcess) -> Iterator[httpx.Client]:
    c = _client(daemon, "read")
    yield c
    c.close()


def _pages(d: DaemonProcess) -> list[str]:
    return ["/ui/", "/ui/programs", "/ui/sessions", f"/ui/session?id={SESSION}",
            "/ui/program?id=sc-live", "/ui/program?id=sc-ended", "/ui/policies",
            "/ui/policy?name=sticky", "/ui/tools", "/ui/workflows"]


def test_a_read_only_token_sees_every_page_and_no_action(daemon: DaemonProcess,
                                                         viewer: httpx.Client,
                                                         ui: httpx.Client) -> None:
    for path in _pages(daemon):
        mine = viewer.get(path)
        assert mine.status_code == 200, (path, mine.text[:500])
        assert not ACTION_FORM.search(mine.text), f"{path} offers an action to a viewer"
        assert "<button" not in mine.text.replace(
            '<button type="submit">Log out</button>', "").replace(
            '<button type="submit">Filter</button>', "").replace(
            '<button type="submit">Show side by side</button>', ""), path
    # The operator's pages do have them: the test above can fail.
    offered = [p for p in _pages(daemon) if ACTION_FORM.search(ui.get(p).text)]
    assert set(offered) == {f"/ui/session?id={SESSION}", "/ui/program?id=sc-live",
                            "/ui/policies", "/ui/policy?name=sticky", "/ui/tools",
                            "/ui/workflows"}, offered
    page = viewer.get("/ui/program?id=sc-live").text
    assert "no actions for a read-only token" in page
    assert "Preview what would be reclaimed" not in viewer.get("/ui/tools").text


def test_a_read_only_token_sees_no_cancel_on_a_running_run(daemon: DaemonProcess,
                                                           viewer: httpx.Client,
                                                           ui: httpx.Client) -> None:
    r = daemon.post("/v1/runs", json={"workflow": "sleeper", "session_id": SESSION})
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    try:
        wait_for(lambda: daemon.get(f"/v1/runs/{run_id}").json()["status"] == "running",
                 30, f"run {run_id} running")
        mine = viewer.get(f"/ui/run?id={run_id}")
        assert mine.status_code == 200, mine.text[:500]
        assert 'id="cancel-run"' in ui.get(f"/ui/run?id={run_id}").text
        assert 'id="cancel-run"' not in mine.text and not ACTION_FORM.search(mine.text)
    finally:
        r = httpx.delete(f"{daemon.url}/v1/runs/{run_id}", headers=daemon.auth_headers(),
                         timeout=30)
        assert r.status_code == 200, r.text


def test_a_submit_token_may_release_but_not_kill(daemon: DaemonProcess) -> None:
    c = _client(daemon, "submit,read")
    try:
        page = c.get("/ui/program", params={"id": "sc-live"}).text
        assert 'aria-label="release program sc-live"' in page
        for operator_only in ("kill", "pause", "resume", "migrate"):
            assert f'aria-label="{operator_only} program sc-live"' not in page
        assert 'id="run-form"' in c.get("/ui/workflows").text  # submit starts runs
        assert not ACTION_FORM.search(c.get("/ui/tools").text)  # reclaim is operator's
        assert not ACTION_FORM.search(c.get("/ui/policy?name=sticky").text)
    finally:
        c.close()
    assert program(daemon, "sc-live")["status"] not in ("STOPPED", "FAILED")
