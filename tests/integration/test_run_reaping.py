"""A run's jail kills only that run's processes, however busy the machine is.

A jail finds the processes a run left behind by the namespaces its sandbox entered. The
kernel hands a freed namespace's inode number to the next namespace created anywhere on
the machine, so once a run's namespaces are gone their numbers may name someone else's:
the 30-minute soak lost runs "killed by SIGKILL" to the reaper of the run that had just
ended, which found the next run's fresh sandbox under its old numbers.

Here, while short runs end one after another on a real daemon, this test keeps starting
processes in fresh namespaces of its own, as other runs, containers or daemons on the
machine do. None of them may be killed, every run must finish, and no run's reaper may
report a process killed (these runs leave none behind). And the namespaces a jail holds
still find what a run does leave behind, where nothing else would (no cgroup, no uid).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import session_trace, wait_for_exit, wait_for_trace

RUNS = 40
IN_FLIGHT = 4
# A neighbour lives long enough for a reaper's scan to find it; a new one every few ms
# takes the inode numbers a run frees before that run's reaper looks.
NEIGHBOUR_LIFE_S = 1.0
NEIGHBOUR_EVERY_S = 0.01
WORKFLOW = "def main(n: int) -> int:\n    return n\n"
# A child in a session of its own, asleep 20 s: killing the run's process group misses it.
LEAVER = ("from escape_attempts import _fork_nowait, _sleeping_child\n\n\n"
          "def main() -> int:\n    return _fork_nowait(_sleeping_child(0))\n")


def _unshare_argv() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount"]


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run([*_unshare_argv(), "true"], capture_output=True, timeout=30)
    return done.returncode == 0


class Neighbours:
    """Processes in namespaces of their own, started back to back until stopped."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._start_them, daemon=True)

    def __enter__(self) -> Neighbours:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for proc in self.procs:
            proc.wait(30)

    def _start_them(self) -> None:
        argv = [*_unshare_argv(), "sleep", str(NEIGHBOUR_LIFE_S)]
        while not self._stop.is_set():
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
            self._stop.wait(NEIGHBOUR_EVERY_S)

    def killed(self) -> int:
        return sum(proc.returncode == -9 for proc in self.procs)


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    if not _can_unshare():
        pytest.skip("this machine does not let the test create namespaces")
    daemon = DaemonProcess(tmp_path_factory.mktemp("reaping") / "data").start()
    try:
        r = daemon.post("/v1/workflows", json={"name": "short", "files": {"main.py": WORKFLOW},
                                               "entry": "main:main"})
        assert r.status_code == 201, r.text
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def marks_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon whose runs get neither a pids cgroup nor a uid of their own."""
    env = {"AGENTD_SANDBOX_DISABLE": "pids-cgroup,uid"}
    daemon = DaemonProcess(tmp_path_factory.mktemp("marks") / "data", env=env).start()
    try:
        files = {"main.py": LEAVER,
                 "escape_attempts.py": (Path(__file__).parent / "escape_attempts.py").read_text()}
        r = daemon.post("/v1/workflows", json={"name": "leaver", "files": files,
                                               "entry": "main:main"})
        assert r.status_code == 201, r.text
        yield daemon
    finally:
        daemon.stop()


def _run(d: DaemonProcess, n: int, workflow: str = "short") -> dict[str, Any]:
    args = {"n": n} if workflow == "short" else {}
    r = d.post("/v1/runs", json={"workflow": workflow, "args": args,
                                 "session_id": f"reaping-{n}"})
    assert r.status_code == 201, r.text
    return d.run_ended(r.json()["id"], 120)


def _reaped(d: DaemonProcess, n: int) -> list[int]:
    return [e["data"]["processes_killed"] for e in session_trace(d, f"reaping-{n}")
            if e["kind"] == "run.reaped"]


def test_ending_runs_kill_no_process_of_anyone_else(d: DaemonProcess) -> None:
    with Neighbours() as neighbours, ThreadPoolExecutor(IN_FLIGHT) as pool:
        views = list(pool.map(lambda n: _run(d, n), range(RUNS)))
    failed = [(v["id"], (v["error"] or {}).get("reason")) for v in views
              if v["status"] != "finished"]
    assert not failed, f"{len(failed)} of {RUNS} runs failed: {failed}"
    assert neighbours.killed() == 0, (
        f"run reapers SIGKILLed {neighbours.killed()} of {len(neighbours.procs)} processes "
        "that were no run's")
    for n in range(RUNS):
        wait_for_trace(d, f"reaping-{n}", "run.reaped")
    reaped = {n: _reaped(d, n) for n in range(RUNS)}
    assert all(len(counts) == 1 for counts in reaped.values()), reaped
    assert sum(counts[0] for counts in reaped.values()) == 0, reaped


def test_a_left_child_is_found_by_the_namespaces_held(marks_only: DaemonProcess) -> None:
    view = _run(marks_only, 0, "leaver")
    assert view["status"] == "finished", view
    trace = wait_for_trace(marks_only, "reaping-0", "run.reaped")
    [confined] = [e["data"]["layers"] for e in trace if e["kind"] == "run.confined"]
    if not {"mountns", "netns"} & set(confined):
        pytest.skip(f"no namespaces on this machine to find a run's processes by: {confined}")
    assert not {"pids-cgroup", "uid"} & set(confined), confined
    child = int(view["result"])
    wait_for_exit(child, 5, f"the run's child {child} to end with it")
    assert _reaped(marks_only, 0) == [1]
