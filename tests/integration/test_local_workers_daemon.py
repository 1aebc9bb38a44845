"""Local workers never outlive their daemon (issue 21, defect 9: after kill -9 of the
daemon, 7 of 11 restarts left the old local worker running, PPID 1, under the same id as
the new one, never reclaimed)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from daemon.workers.local import RECORD_FILE, describe, process_start_time, write_record
from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for
from tests.worker_socket import serves


def _pids(d: DaemonProcess) -> dict[str, int]:
    return {w["id"]: w["pid"] for w in d.get("/v1/workers").json()["data"]}


def _healthy_pid(d: DaemonProcess) -> int | None:
    [worker] = [w for w in d.get("/v1/workers").json()["data"] if w["id"] == "local-sim-0"]
    return int(worker["pid"]) if worker["status"] == "healthy" else None


def test_local_workers_exit_when_their_daemon_is_killed(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d: DaemonProcess = daemon_factory(workers=2).start()
    assert d.proc is not None
    group = d.proc.pid
    pids = list(_pids(d).values())
    try:
        d.kill()
        wait_for(lambda: all(process_start_time(pid) is None for pid in pids), 15,
                 f"the killed daemon's workers {pids} to exit")
        d.start()  # the next start has its own, and only those
        assert not set(_pids(d).values()) & set(pids)
        assert serves(d)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what the old code left running
            os.killpg(group, signal.SIGKILL)


def test_a_worker_left_running_is_stopped_at_the_next_start(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """A local worker recorded by a previous daemon and still running (one that ignored
    the parent-death signal, or an older agentd's) is stopped before the new daemon
    starts its own under the same id."""
    d: DaemonProcess = daemon_factory(workers=1).start()
    assert d.stop() == 0
    assert d.config_dir is not None
    stale = subprocess.Popen(  # as the supervisor starts it, without the signal
        [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim", "--connect",
         f"ipc://{d.data_dir / 'workers.sock'}", "--worker-id", "local-sim-0",
         "--key-file", str(d.config_dir / "worker.key")],
        env=d.process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        recorded = describe("local-sim-0", stale.pid)
        assert recorded is not None
        write_record(d.data_dir / RECORD_FILE, [recorded])
        d.start()
        stale.wait(15)
        wait_for(lambda: _healthy_pid(d) not in (None, stale.pid), 30,
                 "the new daemon's own local-sim-0")
        assert serves(d)
        assert "left running by a previous daemon" in d.log()
    finally:
        stale.kill()
        stale.wait(5)
