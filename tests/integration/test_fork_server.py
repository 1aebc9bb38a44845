"""Sandboxes forked by the daemon's fork server (daemon/runtime/zygote.py).

On a real daemon: a run's sandbox is a fork of the server (`run.started` says `start:
"fork"`), confined with the same layers as an exec'd one and answering the same; the server
holds nothing of any run (its memory is searched for a live run's id and arguments);
a server killed under a running run ends that run with a reason and the next run starts
another; `runtime_fork_server = false` exec's each sandbox as before.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import session_trace, wait_for_trace

# `hold`: the run stays alive until the test ends it (a cancel, or its server killed).
WORKFLOW = """\
import os
import threading


def main(marker: str, hold: bool = False) -> dict:
    if hold:
        threading.Event().wait()
    return {"marker": marker, "cwd": os.getcwd(), "pid": os.getpid(),
            "run": os.environ["AGENTD_RUN_ID"], "env": sorted(os.environ)}
"""


def _start(tmp: Path, name: str, env: dict[str, str] | None = None) -> DaemonProcess:
    daemon = DaemonProcess(tmp / name, env=env or {}).start()
    r = daemon.post("/v1/workflows", json={"name": "fork", "files": {"main.py": WORKFLOW},
                                           "entry": "main:main"})
    assert r.status_code == 201, r.text
    return daemon


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = _start(tmp_path_factory.mktemp("fork"), "data")
    try:
        yield daemon
    finally:
        daemon.stop()


def _submit(d: DaemonProcess, session: str, **args: Any) -> str:
    r = d.post("/v1/runs", json={"workflow": "fork", "session_id": session, "args": args})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _started(d: DaemonProcess, session: str) -> dict[str, Any]:
    [started] = [e["data"] for e in wait_for_trace(d, session, "run.started")
                 if e["kind"] == "run.started"]
    return dict(started)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _is_server(pid: int) -> bool:
    return b"daemon.runtime.sandbox.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes()


def _memory_holds(pid: int, needles: list[bytes]) -> list[bytes]:
    """Which of `needles` the process's writable memory holds (read as root)."""
    found: set[bytes] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "rw" not in perms:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
            found |= {n for n in needles if n in chunk}
    return sorted(found)


def test_a_run_is_forked_and_answers_as_an_execd_one(d: DaemonProcess) -> None:
    view = d.run_ended(_submit(d, "fork-one", marker="m-one"), 60)
    assert view["status"] == "finished", view
    result = view["result"]
    assert result["marker"] == "m-one" and result["run"] == view["id"]
    started = _started(d, "fork-one")
    assert started["start"] == "fork", started
    # the run's own environment and place, and nothing of the daemon's
    assert {"AGENTD_RUN_TOKEN", "AGENTD_PROGRAM_ID", "PATH"} <= set(result["env"])
    assert not [k for k in result["env"] if k.startswith(("AGENTD_DB", "HOME", "XDG"))]
    assert Path(result["cwd"]).name == "work"
    confined = [e["data"]["layers"] for e in session_trace(d, "fork-one")
                if e["kind"] == "run.confined"]
    assert confined and confined[0], confined


def test_the_server_holds_nothing_of_a_live_run(d: DaemonProcess) -> None:
    """The run's arguments and its first line (environment, token, working directory,
    all beside its id) go to the child's own stdin, never through the server, whose
    memory every later sandbox inherits."""
    if os.geteuid() != 0:
        pytest.skip("reading another process's memory needs root")
    marker = "fork-secret-" + os.urandom(8).hex()
    run_id = _submit(d, "fork-live", marker=marker, hold=True)
    sandbox = int(_started(d, "fork-live")["pid"])
    server = _parent(sandbox)
    assert _is_server(server), f"the sandbox's parent {server} is not the fork server"
    try:
        needles = [marker.encode(), run_id.encode()]
        assert set(_memory_holds(sandbox, needles)) == set(needles), (
            "the search does not find what the sandbox itself holds")
        assert _memory_holds(server, needles) == []
        assert d.get(f"/v1/runs/{run_id}").json()["status"] == "running"
    finally:
        httpx.delete(f"{d.url}/v1/runs/{run_id}", headers=d.auth_headers(), timeout=30)


def test_a_killed_server_ends_its_run_and_the_next_run_starts_another(
        d: DaemonProcess) -> None:
    run_id = _submit(d, "fork-lost", marker="lost", hold=True)
    sandbox = int(_started(d, "fork-lost")["pid"])
    server = _parent(sandbox)
    assert _is_server(server)
    os.kill(server, signal.SIGKILL)
    view = d.run_ended(run_id, 30)
    assert view["status"] == "failed", view
    assert "SIGKILL" in (view["error"] or {}).get("reason", ""), view
    after = d.run_ended(_submit(d, "fork-after", marker="after"), 60)
    assert after["status"] == "finished" and after["result"]["marker"] == "after", after
    assert _started(d, "fork-after")["start"] == "fork"  # by a new server: the old one is gone


def test_turned_off_each_sandbox_is_execd(tmp_path: Path) -> None:
    daemon = _start(tmp_path, "data", {"AGENTD_RUNTIME_FORK_SERVER": "false"})
    try:
        view = daemon.run_ended(_submit(daemon, "exec-one", marker="m-exec"), 60)
        assert view["status"] == "finished" and view["result"]["marker"] == "m-exec", (
            view, daemon.get(f"/v1/runs/{view['id']}/log").text)
        assert _started(daemon, "exec-one")["start"] == "exec"
    finally:
        daemon.stop()


# Eight sandboxes forked on uvloop, the daemon's loop, each given its spec and read to its end.
SPAWNS = """\
import asyncio, json, os, sys
import uvloop
from daemon.runtime.zygote import REPORT_FD, ForkServer

work = sys.argv[1]
env = {"PATH": "/usr/bin:/bin", "AGENTD_DAEMON_URL": "http://127.0.0.1:9", "AGENTD_RUN_ID": "r",
       "AGENTD_PROGRAM_ID": "p", "AGENTD_SESSION_ID": "s", "AGENTD_RUN_TOKEN": "t"}

async def one(server, log):
    confine_r, confine_w = os.pipe()
    report_r, report_w = os.pipe()
    os.write(confine_w, json.dumps({"layers": [], "report_fd": REPORT_FD}).encode())
    os.close(confine_w)
    try:
        proc = await server.spawn(__import__("pathlib").Path(work), env, log, confine_r, report_w)
    finally:
        os.close(confine_r)
        os.close(report_w)
    proc.stdin.write(json.dumps({"entry": "mod:main", "args": {}}).encode())
    await proc.stdin.drain()
    proc.stdin.close()
    out = await proc.stdout.read()
    await proc.wait()
    os.close(report_r)
    return json.loads(out)

async def main():
    server = ForkServer()
    with open(os.path.join(work, "log"), "wb") as log:
        return await asyncio.gather(*(one(server, log.fileno()) for _ in range(8)))

print(json.dumps(uvloop.run(main())))
"""


def test_each_descriptor_is_closed_once_on_the_daemons_loop(tmp_path: Path) -> None:
    """uvloop (the daemon's loop) closes a pipe transport's fd and then the file object
    holding it: a second close() of a number another thread may have opened meanwhile
    (the daemon saw EBADF on /proc and SQLite I/O errors under 32 runs started at once).
    Under strace, no close() of the server's spawns may fail."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (.ci/run installs it)")
    (tmp_path / "mod.py").write_text("def main():\n    return 7\n")
    (tmp_path / "spawns.py").write_text(SPAWNS)
    trace = tmp_path / "strace.out"
    done = subprocess.run([strace, "-f", "-qq", "-e", "trace=close", "-e", "status=failed",
                           "-o", str(trace), sys.executable, str(tmp_path / "spawns.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"ok": True, "result": 7}] * 8
    failed = [line for line in trace.read_text().splitlines() if "EBADF" in line]
    assert failed == [], f"{len(failed)} descriptors closed twice: {failed[:4]}"
