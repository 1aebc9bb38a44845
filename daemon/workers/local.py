"""Local worker processes never outlive their daemon.

A local worker retries its registration for ever, so one left behind by a daemon that
was killed (kill -9, the OOM killer) held its memory (and a GPU's) and registered with
the next daemon under the same id as that daemon's own worker. Two guards:

- The parent-death signal. The supervisor names itself in the worker's environment
  (`AGENTD_DAEMON_PID`); the worker asks the kernel (prctl PR_SET_PDEATHSIG) for SIGTERM
  when its parent dies, which stops it as `agentd stop` would, and exits at once if
  its parent is no longer that daemon (it died before the signal was armed). The kernel
  sends the signal when the parent *thread* that forked the worker ends: asyncio forks
  subprocesses from the event loop's thread, which lives as long as the daemon.
- The pid record. The supervisor writes each local worker's pid and start time to
  `<data dir>/local-workers.json`; the next start terminates any that still runs (a
  worker that ignored the signal, or one started by an older agentd). A recorded pid is
  only signalled while it is the same process: its start time (/proc/PID/stat) is the
  recorded one and its command line is an agentd worker's with the recorded id, so a
  pid the kernel gave to another process since is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("agentd.local_workers")

DAEMON_PID_ENV = "AGENTD_DAEMON_PID"
RECORD_FILE = "local-workers.json"
_PR_SET_PDEATHSIG = 1
STOP_WAIT_S = 10.0  # for a stale worker to stop on SIGTERM before it gets SIGKILL


@dataclass(frozen=True)
class LocalWorker:
    worker_id: str
    pid: int
    start_time: int  # clock ticks after boot: with the pid, one process for ever


def die_with_daemon(env: Mapping[str, str] = os.environ) -> None:
    """In a worker the supervisor started: SIGTERM when the daemon dies. A no-op for a
    worker started by hand (`agentd worker --connect`), which outlives daemon restarts."""
    daemon_pid = env.get(DAEMON_PID_ENV)
    if not daemon_pid or sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != int(daemon_pid):
        raise SystemExit(f"agentd worker: the daemon that started it (pid {daemon_pid}) "
                         "has exited")


def process_start_time(pid: int) -> int | None:
    """When a live process started (clock ticks after boot); None when there is no such
    process or only its zombie is left."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name in parentheses may hold spaces and ')': split after the last one.
    fields = stat.rsplit(")", 1)[1].split()
    state, start_time = fields[0], fields[19]  # fields 3 and 22 of proc(5)
    return None if state in ("Z", "X") else int(start_time)


def _command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return raw.decode(errors="replace").split("\0")


def is_running(worker: LocalWorker) -> bool:
    """Whether the recorded process still runs: same pid, same start, a worker command."""
    if process_start_time(worker.pid) != worker.start_time:
        return False
    argv = _command_line(worker.pid)
    return (argv[1:4] == ["-m", "daemon.commands.cli", "worker"]
            and "--worker-id" in argv and worker.worker_id in argv)


def describe(worker_id: str, pid: int) -> LocalWorker | None:
    """The record of a process just started; None when it has exited already."""
    start_time = process_start_time(pid)
    return None if start_time is None else LocalWorker(worker_id, pid, start_time)


def write_record(path: Path, workers: list[LocalWorker]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(w) for w in workers]))
    tmp.replace(path)  # whole or not at all: a crash mid-write leaves the last record


def read_record(path: Path) -> list[LocalWorker]:
    try:
        return [LocalWorker(str(w["worker_id"]), int(w["pid"]), int(w["start_time"]))
                for w in json.loads(path.read_text())]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable record of local workers %s: %s", path, exc)
        return []


async def reap_stale(path: Path, on_event: Callable[..., None]) -> list[LocalWorker]:
    """Stop the recorded workers that still run (SIGTERM, then SIGKILL after
    STOP_WAIT_S); returns them. Call before starting new ones."""
    stale = [w for w in await asyncio.to_thread(read_record, path) if is_running(w)]
    for worker in stale:
        log.warning("stopping local worker %s (pid %d), left running by a previous daemon",
                    worker.worker_id, worker.pid)
    stubborn = await _stop(stale, signal.SIGTERM, STOP_WAIT_S)
    for worker in stubborn:
        log.warning("local worker %s (pid %d) ignored SIGTERM; killing it",
                    worker.worker_id, worker.pid)
    await _stop(stubborn, signal.SIGKILL, STOP_WAIT_S)
    for worker in stale:
        on_event("worker.process.reaped", worker_id=worker.worker_id, pid=worker.pid)
    return stale


async def _stop(workers: list[LocalWorker], sig: int, wait_s: float) -> list[LocalWorker]:
    """Send `sig` to each; returns those still running after `wait_s`."""
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):  # it exited since the check
            os.kill(worker.pid, sig)
    deadline = time.monotonic() + wait_s
    # Other processes' exits, not ours to be told of: polled.
    while (running := list(filter(is_running, workers))) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return running
