"""A run's token against a real daemon: bound to its run's programs and session at the
gateway and on every program route; operator and ordinary submit tokens unchanged; the
token of a run a crashed daemon left behind is revoked at the next start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

HOLDER = '''import os
import time

import agentd


def main(hold: float = 60.0) -> str:
    agentd.ManagedDict("holder")["token"] = os.environ["AGENTD_RUN_TOKEN"]
    time.sleep(hold)  # alive, its token with it, until the test cancels the run
    return "held"
'''
STALE_NAME = "run run-0123456789abcdef"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path_factory.mktemp("runtok") / "data").start()
    yield daemon
    daemon.stop()


def _chat(d: DaemonProcess, token: str, **extra: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", **extra.pop("headers", {})}
    model = d.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            **extra}
    return httpx.post(f"{d.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def _refused(resp: httpx.Response, param: str, run_id: str) -> None:
    assert resp.status_code == 403, resp.text
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("run_token", param), err
    assert err["message"].startswith(f"{param}: run {run_id}'s token may act only on its own")


def _holding_run(d: DaemonProcess, session: str) -> tuple[dict[str, Any], str]:
    r = d.post("/v1/runs", json={"workflow": "holder", "session_id": session})
    assert r.status_code == 201, r.text
    run = r.json()

    def stored_token() -> str | None:
        state = d.get(f"/v1/runs/{run['id']}/state").json().get("state") or {}
        token = state.get("holder", {}).get("token")
        return None if token is None else str(token)

    return run, wait_for(stored_token, 30, lambda: f"the run to store its token\n{d.log()}")


def test_a_run_token_acts_only_on_its_own_run(d: DaemonProcess) -> None:
    assert d.post("/v1/workflows", json={"name": "holder", "files": {"main.py": HOLDER},
                                         "entry": "main:main"}).status_code == 201
    # another session's program, made by an ordinary client
    assert _chat(d, d.token, program_id="victim-prog", session_id="victim").status_code == 200
    run, token = _holding_run(d, "s-holder")
    other, _ = _holding_run(d, "s-other")
    rid, prog = run["id"], run["program_id"]
    try:
        # its own programs, and new ones under its program, land in its session
        assert _chat(d, token, program_id=prog).status_code == 200
        mine = _chat(d, token, program_id=f"{prog}.Helper.0")
        assert mine.status_code == 200 and mine.json()["session_id"] == "s-holder"
        assert d.get(f"/v1/programs/{prog}.Helper.0").json()["session_id"] == "s-holder"
        # anything else is refused, naming the field it came in
        _refused(_chat(d, token, program_id="victim-prog"), "program_id", rid)
        _refused(_chat(d, token, program_id=other["program_id"]), "program_id", rid)
        _refused(_chat(d, token, headers={"X-Program-Id": "victim-prog"}), "X-Program-Id", rid)
        _refused(_chat(d, token), "program_id", rid)
        _refused(_chat(d, token, program_id=prog, session_id="victim"), "session_id", rid)
        as_run = {"Authorization": f"Bearer {token}"}
        for path, param in (("/v1/programs/victim-prog/release", "program_id"),
                            (f"/v1/programs/{other['program_id']}/release", "program_id"),
                            ("/v1/programs/victim-prog/tools/sh/exec", "program_id"),
                            (f"/v1/runs/{other['id']}/events", "run_id")):
            _refused(httpx.post(f"{d.url}{path}", headers=as_run, json={"command": "id",
                                                                        "events": []},
                                timeout=10), param, rid)
        assert d.get("/v1/programs/victim-prog").json()["status"] != "STOPPED"
        released = httpx.post(f"{d.url}/v1/programs/{prog}.Helper.0/release", headers=as_run,
                              timeout=10)
        assert released.status_code == 200 and released.json()["status"] == "STOPPED"
        # operator and ordinary submit tokens are not bound to a run (only, like every
        # non-operator token, to their tenant: here the run's session's)
        tenant = d.get("/v1/sessions/s-holder").json()["tenant"]
        created = d.cli("token", "create", "--scope", "submit", "--name", "a client",
                        "--tenant", tenant)
        assert created.returncode == 0, created.stderr
        client = _secret(created.stdout)
        assert _chat(d, client, program_id=f"{prog}.Elsewhere", session_id="s-holder"
                     ).status_code == 200
        assert d.post("/v1/programs/victim-prog/release").status_code == 200
    finally:
        for r in (run, other):
            httpx.delete(f"{d.url}/v1/runs/{r['id']}", headers=d.auth_headers(), timeout=10)
    # The auth cache may still hold the record; the run's end (the cancel's answer came
    # after it) refuses the token at once all the same.
    assert _chat(d, token, program_id=prog).status_code == 401


def _secret(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]  # `token create` prints only the secret


def test_a_run_token_left_by_a_crash_is_revoked_at_start(d: DaemonProcess) -> None:
    d.stop()
    # what a daemon killed while a run was live leaves in the store: an active token named
    # for the run (written here with the CLI, which writes the store directly)
    stale = d.cli("token", "create", "--scope", "submit", "--name", STALE_NAME)
    kept = d.cli("token", "create", "--scope", "submit", "--name", "run nightly")
    assert stale.returncode == 0 and kept.returncode == 0, stale.stderr + kept.stderr
    d.start()
    assert d.get("/v1/models", token=_secret(stale.stdout)).status_code == 401
    assert d.get("/v1/models", token=_secret(kept.stdout)).status_code == 200
    assert "revoked 1 token(s) of runs that did not survive a restart" in d.log()
