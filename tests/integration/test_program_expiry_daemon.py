"""Programs that end when idle, on a real daemon (daemon/core/expiry.py): a program nobody
releases ends after its tenant's `program_idle_timeout_s`, its tool reclaimed and the
reason traced; the bulk release of idle programs through the API and `agentctl`; and
`agentctl top --once --json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for, wait_for_trace

MODEL = "sim-llama3-8b"
CONFIG = """
[tools.shell]
backend = "process"
command = []
exec_timeout_s = 10

[slo.tenants.quick]
program_idle_timeout_s = 1
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("expiry")
    config = tmp / "agentd.toml"
    config.write_text(CONFIG)
    d = DaemonProcess(tmp / "data", extra_args=["--config", str(config)]).start()
    yield d
    d.stop()


def chat(d: DaemonProcess, program_id: str, tenant: str, token: str | None = None) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "program_id": program_id, "session_id": f"s-{program_id}"}
    headers = {} if token is not None else {"X-Tenant": tenant}
    r = d.post("/v1/chat/completions", token=token, json=body, headers=headers)
    assert r.status_code == 200, r.text


def program(d: DaemonProcess, program_id: str) -> dict[str, Any]:
    r = d.get(f"/v1/programs/{program_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def tool_owners(d: DaemonProcess) -> set[str]:
    return {t["program_id"] for t in d.get("/v1/tools").json()["data"] if t.get("program_id")}


def agentctl(d: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTD_URL": d.url, "AGENTD_TOKEN": d.token}
    return subprocess.run([sys.executable, "-m", "console.agentctl", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_an_idle_program_is_released_with_its_tool_and_the_reason_traced(
        daemon: DaemonProcess) -> None:
    chat(daemon, "idle-quick", "quick")
    r = daemon.post("/v1/programs/idle-quick/tools/shell/exec", json={"command": "echo hi"})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    assert "idle-quick" in tool_owners(daemon)
    chat(daemon, "idle-default", "other")  # the default timeout: 1800 s

    events = wait_for_trace(daemon, "s-idle-quick", "program.expired")
    [expired] = [e for e in events if e["kind"] == "program.expired"]
    assert expired["data"]["setting"] == "slo.tenants.quick.program_idle_timeout_s"
    assert expired["data"]["timeout_s"] == 1 and expired["data"]["idle_s"] >= 1
    assert program(daemon, "idle-quick")["status"] == "STOPPED"
    assert program(daemon, "idle-quick")["status_reason"].startswith("idle for ")
    wait_for(lambda: "idle-quick" not in tool_owners(daemon), 15, "the tool to be reclaimed")
    assert program(daemon, "idle-default")["status"] == "ACTING"


def test_agentctl_lists_idle_programs_and_releases_them_with_yes(
        daemon: DaemonProcess) -> None:
    chat(daemon, "cli-idle", "cli")
    listed = agentctl(daemon, "release-idle", "--idle", "0", "--tenant", "cli")
    assert listed.returncode == 0, listed.stderr
    assert "cli-idle" in listed.stdout and "--yes" in listed.stdout
    assert program(daemon, "cli-idle")["status"] == "ACTING"  # a dry run

    done = agentctl(daemon, "release-idle", "--idle", "0", "--tenant", "cli", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert [p["id"] for p in answer["data"]] == ["cli-idle"] and answer["released"] == 1
    assert program(daemon, "cli-idle")["status"] == "STOPPED"
    events = wait_for_trace(daemon, "s-cli-idle", "program.expired")
    [expired] = [e for e in events if e["kind"] == "program.expired"]
    assert expired["data"]["by"].startswith("operator")


def test_a_tenant_token_releases_only_its_own_idle_programs(daemon: DaemonProcess) -> None:
    made = daemon.cli("token", "create", "--scope", "read,submit", "--name", "own",
                      "--tenant", "own")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    chat(daemon, "own-idle", "own", token=token)
    chat(daemon, "theirs-idle", "theirs")
    r = daemon.post("/v1/programs/release-idle", token=token,
                    json={"idle_s": 0, "tenant": "theirs"})
    assert r.status_code == 403 and r.json()["error"]["param"] == "tenant", r.text
    r = daemon.post("/v1/programs/release-idle", token=token, json={"idle_s": 0})
    assert r.status_code == 200, r.text
    assert [p["id"] for p in r.json()["data"]] == ["own-idle"]
    assert program(daemon, "own-idle")["status"] == "STOPPED"
    assert program(daemon, "theirs-idle")["status"] == "ACTING"


@pytest.mark.parametrize("body", [{}, {"idle_s": -1}, {"idle_s": "soon"},
                                  {"idle_s": 5, "dry_run": "yes"}])
def test_a_bad_bulk_release_is_a_400_naming_the_field(daemon: DaemonProcess,
                                                       body: dict[str, Any]) -> None:
    r = daemon.post("/v1/programs/release-idle", json=body)
    assert r.status_code == 400, r.text
    field = "dry_run" if "dry_run" in body else "idle_s"
    assert field in r.text


def test_top_once_json_prints_json(daemon: DaemonProcess, tmp_path: Path) -> None:
    done = agentctl(daemon, "top", "--once", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["url"] == daemon.url and data["health"]["status"] == "ok"
    assert set(data["programs_by_status"]) >= {"ACTING", "STOPPED"}
    assert any(p["layer"] == "kv" for p in data["active_policies"])
    tui = agentctl(daemon, "tui", "--json")
    assert tui.returncode == 2 and "top --once --json" in tui.stderr
