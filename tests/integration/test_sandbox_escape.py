"""Sandbox escapes tried by a real workflow on a real daemon: every one must fail, and
the run's status and trace must say why.

The daemon runs in four configurations, from every layer this machine allows down to
what is left without the audit hook, Landlock and namespaces, so that each kernel layer
is shown to hold on its own and not only behind the audit hook (`AGENTD_SANDBOX_DISABLE`
turns layers off). An attempt runs only where some active layer is meant to stop it
(attempts that write or fork also cap themselves); which attempts a configuration
leaves uncontained is printed, and docs/threat-model.md lists the same.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for, wait_for_trace

HERE = Path(__file__).parent
CONFIGS = {
    "all-layers": "",
    "no-audit-hook": "audit-hook",
    "namespaces-and-uid": "audit-hook,landlock",
    "no-namespaces": "audit-hook,landlock,mountns,netns",
}
# Which layers are meant to stop each attempt (any one of them suffices).
FILES = {"audit-hook", "landlock", "mountns", "uid"}
STOPPED_BY: dict[str, set[str]] = {
    "read-db": FILES, "sqlite-db": FILES, "read-token": FILES, "read-other-run": FILES,
    "exec-read-db": {"landlock", "mountns", "uid"},  # the audit hook never sees it
    "write-tmp": {"audit-hook", "landlock", "mountns"},  # /tmp is open to every uid
    "fill-workdir": {"tmpfs-quota", "disk-watchdog"},
    "fork": {"audit-hook"},
    "fork-bomb": {"pids-cgroup", "nproc"},
    "tcp-out": {"audit-hook", "landlock-net", "netns"},
    "udp-out": {"audit-hook", "netns"},
    "signal-daemon": {"audit-hook", "landlock-scope", "uid"},
    "api-other-session": {"scopes"}, "api-runs": {"scopes"}, "api-other-state": {"scopes"},
    "api-cancel-other": {"scopes"}, "api-declare-tool": {"scopes"}, "api-tool-exec": {"scopes"},
    "api-release-other": {"scopes"}, "api-chat-other": {"scopes"},
}
VICTIM = ("import time\n\nimport agentd\n\n\ndef main(secret: str):\n"
          "    with open('secret.txt', 'w') as f:\n        f.write(secret)\n"
          "    agentd.ManagedDict('vault')['secret'] = secret\n"
          "    time.sleep(300)  # alive while the attacks run\n")
SECRET = "s3cret-of-the-victim"


@pytest.fixture(scope="module", params=list(CONFIGS))
def setup(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    env = {"AGENTD_SANDBOX_DISABLE": CONFIGS[request.param]}
    d = DaemonProcess(tmp_path_factory.mktemp("escape") / "data", env=env).start()
    try:
        files = {"main.py": (HERE / "escape_attempts.py").read_text()}
        assert d.post("/v1/workflows", json={"name": "escape", "files": files,
                                             "entry": "main:main"}).status_code == 201
        victim = _victim(d)
        yield {"d": d, "config": request.param, "victim": victim,
               "layers": _layers(d, victim["session_id"])}
    finally:
        d.stop()


def _victim(d: DaemonProcess) -> dict[str, Any]:
    """Another session's run that holds a secret in its files and its managed state."""
    assert d.post("/v1/workflows", json={"name": "victim", "files": {"main.py": VICTIM},
                                         "entry": "main:main"}).status_code == 201
    run = d.post("/v1/runs", json={"workflow": "victim", "session_id": "victim-session",
                                   "args": {"secret": SECRET}}).json()
    def stored() -> bool:
        state = d.get(f"/v1/runs/{run['id']}/state").json().get("state") or {}
        return bool(state.get("vault", {}).get("secret") == SECRET)

    wait_for(stored, 30, lambda: f"the victim run to store its state: {d.log()}", interval=0.2)
    return dict(run)


def _layers(d: DaemonProcess, session: str) -> set[str]:
    """The layers the sandbox reported for a run (Landlock's in parts: fs, net, scope)."""
    trace = d.get(f"/v1/sessions/{session}/trace", params={"limit": 1000}).json()["data"]
    [confined] = [e["data"] for e in trace if e["kind"] == "run.confined"]
    layers = set(confined["layers"]) | {"scopes"}
    if "landlock-fs" in layers:
        layers.add("landlock")
    return layers


def _attempt(s: dict[str, Any], name: str, attempt: str, target: str = "",
             limits: dict[str, float] | None = None, timeout: float = 60) -> dict[str, Any]:
    stoppers = STOPPED_BY[name] & s["layers"]
    if not stoppers:
        pytest.skip(f"{name}: no layer meant to stop it is active in {s['config']} "
                    f"({', '.join(sorted(s['layers']))})")
    d: DaemonProcess = s["d"]
    body = {"workflow": "escape", "args": {"attempt": attempt, "target": target},
            "session_id": f"attacker-{name}", "limits": limits or {}}
    r = d.post("/v1/runs", json=body)
    assert r.status_code == 201, r.text
    view = d.run_ended(r.json()["id"], timeout)
    assert view["status"] == "failed", (
        f"ESCAPE: {name} worked under {s['config']} ({sorted(s['layers'])}): {view['result']}")
    reason = view["error"]["reason"]
    trace = wait_for_trace(d, f"attacker-{name}", "run.failed")
    failed = [e["data"] for e in trace if e["kind"] == "run.failed"]
    assert failed and failed[-1]["reason"] == reason, trace
    print(f"[{s['config']}] {name}: stopped ({', '.join(sorted(stoppers))} active): {reason}")
    return dict(view)


def test_reading_the_database_fails(setup: dict[str, Any]) -> None:
    db = setup["d"].data_dir / "agentd.db"
    view = _attempt(setup, "read-db", "open", str(db))
    if "audit-hook" in setup["layers"]:
        assert view["error"]["kind"] == "system" and str(db) in view["error"]["reason"]


def test_opening_the_database_with_sqlite_fails(setup: dict[str, Any]) -> None:
    _attempt(setup, "sqlite-db", "sqlite", str(setup["d"].data_dir / "agentd.db"))


def test_reading_the_database_through_an_exec_fails(setup: dict[str, Any]) -> None:
    db = setup["d"].data_dir / "agentd.db"
    view = _attempt(setup, "exec-read-db", "exec", f"head -c 64 {db}")
    if "landlock" in setup["layers"]:  # no execve at all
        assert view["error"]["reason"].startswith("sandbox (kernel): PermissionError")


def test_reading_the_token_file_fails(setup: dict[str, Any]) -> None:
    token = setup["d"].token_path
    assert token.is_file()
    _attempt(setup, "read-token", "open", str(token))


def test_reading_another_runs_files_fails(setup: dict[str, Any]) -> None:
    victim = setup["victim"]["id"]
    [bundle] = Path("/tmp").glob(f"agentd-{victim}-*/work/main.py")
    _attempt(setup, "read-other-run", "open", str(bundle))


def test_another_sessions_state_is_out_of_reach_through_the_api(setup: dict[str, Any]) -> None:
    victim = setup["victim"]
    for name, path in (("api-other-session", "/v1/sessions/victim-session"),
                       ("api-runs", "/v1/runs"),
                       ("api-other-state", f"/v1/runs/{victim['id']}/state")):
        view = _attempt(setup, name, "api", path)
        assert "403" in view["error"]["reason"] and SECRET not in str(view)


def test_a_run_cannot_release_or_chat_as_another_sessions_program(setup: dict[str, Any]) -> None:
    if setup["config"] != "all-layers":
        pytest.skip("the API is the same in every configuration")
    d: DaemonProcess = setup["d"]
    victim = setup["victim"]["program_id"]
    view = _attempt(setup, "api-release-other", "api", f"POST /v1/programs/{victim}/release")
    assert "403" in view["error"]["reason"] and "program_id" in view["error"]["reason"]
    for target in (victim, f"{victim} victim-session"):
        view = _attempt(setup, "api-chat-other", "chat", target)
        assert "403" in view["error"]["reason"] and "program_id" in view["error"]["reason"]
    assert d.get(f"/v1/programs/{victim}").json()["status"] not in ("STOPPED", "FAILED")
    assert d.get(f"/v1/runs/{setup['victim']['id']}").json()["status"] == "running"

def test_writing_outside_the_working_directory_fails(setup: dict[str, Any]) -> None:
    try:
        _attempt(setup, "write-tmp", "fill", "/tmp", limits={"file_size_mb": 4})
    finally:
        for leftover in Path("/tmp").glob("fill-*"):
            leftover.unlink()


def test_filling_the_disk_stops_at_the_quota(setup: dict[str, Any]) -> None:
    view = _attempt(setup, "fill-workdir", "fill", "",
                    limits={"disk_mb": 32, "file_size_mb": 4})
    reason = view["error"]["reason"]
    assert reason.startswith("disk quota exceeded (32 MiB working directory"), reason
    if "disk-watchdog" in setup["layers"]:
        written = int(re.search(r"(\d+) MiB written", reason).group(1))  # type: ignore[union-attr]
        assert written < 32 + 512, reason  # one watchdog interval of overshoot at most
    assert not list(Path("/tmp").glob(f"agentd-{view['id']}-*")), "its directory was left"


def test_fork_is_refused(setup: dict[str, Any]) -> None:
    view = _attempt(setup, "fork", "fork")
    assert view["error"]["type"] == "SandboxDenied"


def test_a_fork_bomb_is_bounded_and_cleaned_up(setup: dict[str, Any]) -> None:
    view = _attempt(setup, "fork-bomb", "fork_bomb", limits={"processes": 32})
    assert view["error"]["reason"] == "process limit reached (32 processes and threads)"
    d: DaemonProcess = setup["d"]
    wait_for(lambda: not _processes_of_run(view["id"]), 10,
             lambda: f"the run's processes to go: {_processes_of_run(view['id'])} are left")
    trace = wait_for_trace(d, "attacker-fork-bomb", "run.reaped")
    [reaped] = [e["data"] for e in trace if e["kind"] == "run.reaped"]
    assert reaped["processes_killed"] > 0
    if "pids-cgroup" in setup["layers"]:
        assert reaped["forks_refused"] > 0
    assert d.get("/healthz").json()["status"] == "ok"


def _processes_of_run(run_id: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if f"AGENTD_RUN_ID={run_id}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
    return found


def test_network_connections_fail(setup: dict[str, Any]) -> None:
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(1)
        tcp.settimeout(0.5)
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(0.2)
        received: list[bytes] = []
        stop = threading.Event()

        def echo() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    data, peer = udp.recvfrom(64)
                    received.append(data)
                    udp.sendto(data, peer)

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        ran = 0
        try:
            for name, attempt, sock in (("tcp-out", "tcp", tcp), ("udp-out", "udp", udp)):
                host, port = sock.getsockname()
                with contextlib.suppress(pytest.skip.Exception):
                    _attempt(setup, name, attempt, f"{host}:{port}")
                    ran += 1
        finally:
            stop.set()
            thread.join(2)
        if not ran:
            pytest.skip(f"no network layer is active in {setup['config']}")
        with pytest.raises(TimeoutError):
            tcp.accept()
        assert received == []


def test_signalling_the_daemon_fails(setup: dict[str, Any]) -> None:
    _attempt(setup, "signal-daemon", "signal")
    assert setup["d"].proc is not None and setup["d"].proc.poll() is None


def test_the_victim_survived_and_its_secret_stayed_put(setup: dict[str, Any]) -> None:
    d: DaemonProcess = setup["d"]
    view = d.get(f"/v1/runs/{setup['victim']['id']}").json()
    assert view["status"] == "running", view
    assert httpx.delete(f"{d.url}/v1/runs/{view['id']}", headers=d.auth_headers(),
                        timeout=10).json()["status"] == "cancelled"


# Escapes through the API, not through the kernel: a run's token has scope `submit`, but
# it is bound to its own run's programs and session, and tool specs in a request need
# scope operator.


def test_a_run_cannot_cancel_another_run(setup: dict[str, Any]) -> None:
    if setup["config"] != "all-layers":
        pytest.skip("the API is the same in every configuration")
    victim = setup["victim"]["id"]
    _attempt(setup, "api-cancel-other", "api", f"DELETE /v1/runs/{victim}")


def test_a_run_cannot_run_host_commands_through_tool_exec(setup: dict[str, Any]) -> None:
    if setup["config"] != "all-layers":
        pytest.skip("the API is the same in every configuration")
    declare = '{"tools": [{"name": "sh", "backend": "process"}]}'
    exec_body = '{"command": "id -u", "spec": {"backend": "process"}}'
    # on the run's own program, so that the spec check, not the run binding, refuses it
    with contextlib.suppress(AssertionError):  # declaring is not the escape; exec is
        _attempt(setup, "api-declare-tool", "api",
                 f"POST /v1/programs/{{program}}/tools {declare}")
    view = _attempt(setup, "api-tool-exec", "api",
                    f"POST /v1/programs/{{program}}/tools/sh/exec {exec_body}")
    assert "need scope operator" in view["error"]["reason"], view["error"]

