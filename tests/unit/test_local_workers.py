"""The parent-death signal and the reaper of recorded local workers (daemon/workers/local.py),
on real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.workers.local import (
    DAEMON_PID_ENV,
    LocalWorker,
    describe,
    read_record,
    reap_stale,
    write_record,
)

DIE_WITH_DAEMON = "from daemon.workers.local import die_with_daemon; die_with_daemon(); print('on')"


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real `agentd worker` with nobody to register with: it retries until stopped."""
    key = tmp_path / "worker.key"
    key.write_text("agw_unit-test-key\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon.commands.cli", "worker", "--engine", "sim", "--connect",
         f"ipc://{tmp_path / 'nobody.sock'}", "--worker-id", "local-sim-0",
         "--key-file", str(key)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc
    proc.kill()
    proc.wait(5)


def _record(pid: int, worker_id: str = "local-sim-0", start_shift: int = 0) -> LocalWorker:
    found = describe(worker_id, pid)
    assert found is not None
    return LocalWorker(worker_id, pid, found.start_time + start_shift)


async def test_a_recorded_worker_that_still_runs_is_stopped(
        tmp_path: Path, worker: subprocess.Popen[bytes]) -> None:
    path = tmp_path / "local-workers.json"
    write_record(path, [_record(worker.pid)])
    events: list[dict[str, Any]] = []
    stopped = await reap_stale(path, lambda kind, **data: events.append({"kind": kind, **data}))
    assert [w.pid for w in stopped] == [worker.pid]
    assert worker.wait(5) is not None
    assert events == [{"kind": "worker.process.reaped", "worker_id": "local-sim-0",
                       "pid": worker.pid}]


async def test_a_pid_that_is_another_process_now_is_never_signalled(
        tmp_path: Path, worker: subprocess.Popen[bytes]) -> None:
    """Same pid, another start time: the kernel reused the pid. Same start time but not a
    worker's command line, or another worker id: not the recorded worker either."""
    other = await asyncio.create_subprocess_exec(sys.executable, "-c",
                                                 "import time; time.sleep(60)")
    try:
        path = tmp_path / "local-workers.json"
        write_record(path, [_record(worker.pid, start_shift=-1), _record(other.pid),
                            _record(worker.pid, worker_id="local-sim-1")])
        assert await reap_stale(path, lambda *a, **k: None) == []
        assert worker.poll() is None and other.returncode is None
    finally:
        other.kill()
        await other.wait()


def test_an_unreadable_record_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "local-workers.json"
    assert read_record(path) == []
    path.write_text('[{"pid": "x"}')
    assert read_record(path) == []


def test_a_worker_whose_daemon_is_gone_before_it_arms_the_signal_exits(tmp_path: Path) -> None:
    """Its parent is not the daemon named in its environment: that daemon died (the worker
    was reparented) before the signal could be asked for."""
    env = {**os.environ, DAEMON_PID_ENV: "1"}
    gone = subprocess.run([sys.executable, "-c", DIE_WITH_DAEMON], env=env,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and "has exited" in gone.stderr and gone.stdout == ""
    env[DAEMON_PID_ENV] = str(os.getpid())  # its parent: the test is its daemon
    alive = subprocess.run([sys.executable, "-c", DIE_WITH_DAEMON], env=env,
                           capture_output=True, text=True, timeout=60)
    assert alive.returncode == 0 and alive.stdout == "on\n"
