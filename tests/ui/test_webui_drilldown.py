"""The detail pages (session, program, request, worker) for objects in every state,
against a real daemon: live, STOPPED and FAILED programs after the daemon has let them
go (they answer from the store then, without the live-only fields), and the REST
endpoints those pages read (GET /v1/requests/{id}, GET /v1/workers/{id}).

The browser walk of the same pages, a restart included, is in test_webui_browser.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.ui.webui_support import esc, found, program, require_ui, run_program, text_of
from tests.waiting import wait_for

SESSION = "dd-s"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("webui-dd") / "data", workers=1)
    d.start()
    try:
        require_ui(d)
        yield d
    finally:
        d.stop()


def let_go(d: DaemonProcess, program_id: str) -> dict[str, Any]:
    """The program once the daemon has forgotten it: only its stored row is left, which
    has no `held` (the daemon overlays its live fields only while it holds one)."""
    return dict(wait_for(lambda: (p := program(d, program_id)) and "held" not in p and p,
                         60, f"the daemon to let {program_id} go"))


@pytest.fixture(scope="module")
def ended(daemon: DaemonProcess) -> dict[str, dict[str, Any]]:
    """One live, one STOPPED and one FAILED program in one session; the two ended ones
    forgotten by the daemon."""
    for p in ("dd-live", "dd-stopped", "dd-failed"):
        run_program(daemon, p, SESSION)
    assert daemon.post("/v1/programs/dd-stopped/release").status_code == 200
    assert daemon.post("/v1/programs/dd-failed/kill").json()["status"] == "FAILED"
    return {"dd-stopped": let_go(daemon, "dd-stopped"),
            "dd-failed": let_go(daemon, "dd-failed"), "dd-live": program(daemon, "dd-live")}


def test_a_session_with_programs_the_daemon_let_go_opens(
        ui: httpx.Client, ended: dict[str, dict[str, Any]]) -> None:
    """The session page read `p.held`, which only live programs have: it answered 500
    for any session holding an ended program the daemon had forgotten."""
    page = ui.get("/ui/session", params={"id": SESSION})
    assert page.status_code == 200, page.text[:2000]
    for program_id, status in (("dd-live", "ACTING"), ("dd-stopped", "STOPPED"),
                               ("dd-failed", "FAILED")):
        row = found(rf'<tr data-program="{program_id}">.*?</tr>', page.text)
        assert f'href="/ui/program?id={program_id}"' in row
        assert f'st-{status.lower()}">{status}<' in row
    # Ended programs offer no actions; the live one does.
    assert 'aria-label="kill program dd-stopped"' not in page.text
    assert 'aria-label="kill program dd-live"' in page.text


@pytest.mark.parametrize("program_id,status,source", [
    ("dd-live", "ACTING", "Live"), ("dd-stopped", "STOPPED", "On record"),
    ("dd-failed", "FAILED", "On record")])
def test_the_program_page_opens_in_every_status(
        ui: httpx.Client, ended: dict[str, dict[str, Any]], program_id: str, status: str,
        source: str) -> None:
    page = ui.get("/ui/program", params={"id": program_id})
    assert page.status_code == 200, page.text[:2000]
    assert found(r'<p class="note" id="program-source">([^<]*)', page.text, 1
                 ).startswith(source)
    assert f'badge st-{status.lower()}">{status}<' in page.text
    assert f'href="/ui/session?id={SESSION}"' in page.text
    request_id = ended[program_id]["requests"][0]["id"]
    assert f'href="/ui/request?id={request_id}"' in page.text
    assert ('aria-label="release program' in page.text) == (status == "ACTING")
    if status == "FAILED":  # why it ended is on the page
        assert ended[program_id]["status_reason"] in text_of(page.text)


def test_the_request_page_shows_tokens_timings_and_links(
        ui: httpx.Client, ended: dict[str, dict[str, Any]]) -> None:
    req = ended["dd-stopped"]["requests"][0]
    page = ui.get("/ui/request", params={"id": req["id"]})
    assert page.status_code == 200, page.text[:2000]
    text = text_of(page.text)
    assert "On record" in text and req["status"] in text
    assert f"{req['prompt_tokens']} prompt" in text and f"{req['output_tokens']} of at most" \
        in text
    assert found(r"Time to first token</dt><dd>([^<]*)", page.text, 1).endswith(" ms")
    for link in ("/ui/program?id=dd-stopped", f"/ui/session?id={SESSION}",
                 f"/ui/worker?id={req['worker_id']}"):
        assert f'href="{link}"' in page.text


def test_the_worker_page_lists_the_requests_it_ran(
        ui: httpx.Client, ended: dict[str, dict[str, Any]]) -> None:
    req = ended["dd-live"]["requests"][0]
    page = ui.get("/ui/worker", params={"id": req["worker_id"]})
    assert page.status_code == 200, page.text[:2000]
    assert "Live: registered" in page.text
    table = found(r'<table id="worker-requests">.*?</table>', page.text)
    for p in ended.values():
        assert f'href="/ui/request?id={p["requests"][0]["id"]}"' in table


def test_unknown_ids_are_a_404_page_not_a_crash(ui: httpx.Client) -> None:
    for kind in ("program", "request", "worker", "session"):
        page = ui.get(f"/ui/{kind}", params={"id": "<no such>"})
        assert page.status_code == 404, (kind, page.text[:500])
        assert esc("'<no such>'") in page.text


def test_the_api_answers_requests_and_workers_from_the_store(
        daemon: DaemonProcess, ended: dict[str, dict[str, Any]]) -> None:
    req = ended["dd-failed"]["requests"][0]
    got = daemon.get(f"/v1/requests/{quote(req['id'], safe='')}").json()
    assert got["program_id"] == "dd-failed" and got["live"] is False
    assert got["output_tokens"] == req["output_tokens"]
    worker = daemon.get(f"/v1/workers/{req['worker_id']}").json()
    assert worker["live"] is True and worker["status"] == "healthy"
    assert req["id"] in {r["id"] for r in worker["requests"]}
    assert worker["requests_total"] >= 3
    assert len(daemon.get(f"/v1/workers/{req['worker_id']}", params={"limit": 1}
                          ).json()["requests"]) == 1
    for path, param in (("/v1/requests/nope", "request_id"), ("/v1/workers/nope", "worker_id")):
        r = daemon.get(path)
        assert r.status_code == 404 and r.json()["error"]["param"] == param, r.text
    r = daemon.get(f"/v1/workers/{req['worker_id']}", params={"limit": 0})
    assert r.status_code == 400 and "limit" in r.text, r.text


def test_whoami_names_the_token_and_its_scopes(daemon: DaemonProcess) -> None:
    me = daemon.get("/v1/whoami").json()
    assert me["scopes"] == ["read", "submit", "operator"] and me["tenant"] is None
    made = daemon.cli("token", "create", "--scope", "read", "--name", "dd-viewer",
                      "--tenant", "t1")
    assert made.returncode == 0, made.stderr
    viewer = daemon.get("/v1/whoami", token=made.stdout.strip()).json()
    assert viewer == {"name": "dd-viewer", "scopes": ["read"], "tenant": "t1"}
