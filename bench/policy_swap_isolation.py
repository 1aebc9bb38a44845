"""Keep the swap benchmark's clients off the CPU the system under test needs.

A load generator normally runs on another machine; here it shares the cores with the
daemon, and a dispatch stall then measures the client's turn as much as the daemon's.
Modes (`--isolation`):
- `none`: everything at one priority on every core (how the benchmark ran before);
- `nice`: the load process runs at `CLIENT_NICE`, and the sim workers at `WORKER_NICE`:
  they stand in for GPUs, whose work takes no CPU from the scheduler on a serving box,
  yet their answers free the slots the daemon dispatches into, so they rank between
  the daemon and the client;
- `pin` (the default with 2 or more cores): `nice`, and the workers, the load process
  and the benchmark's own process are kept off one core (`os.sched_setaffinity`), which
  only the daemon may use: the deployment choice of a serving box that gives its
  scheduler a dedicated core. The daemon keeps every core: confined to one, its store
  thread's SQLite work and ZeroMQ's I/O thread would take that core from its event loop
  (they run outside the GIL). Other programs on the machine may still run on its core;
  the loop thread's wait for a CPU (schedstat, and the probe's loop lags) shows how much.
Linux applies nice and affinity per thread, so both are set on every thread of a process;
threads started later inherit them from the thread that starts them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

MODES = ("pin", "nice", "none")
CLIENT_NICE = 10
WORKER_NICE = 5


def default_mode() -> str:
    return "pin" if len(os.sched_getaffinity(0)) >= 2 else "nice"


def _threads(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return []


def set_nice(pid: int, nice: int) -> None:
    for tid in _threads(pid):
        os.setpriority(os.PRIO_PROCESS, tid, nice)


def set_cores(pid: int, cores: set[int]) -> None:
    for tid in _threads(pid):
        os.sched_setaffinity(tid, cores)


def split_cores() -> tuple[set[int], set[int]]:
    """(the core only the daemon uses, everyone else's): the last core, so that the
    first, where many interrupts land, goes to the clients."""
    cores = sorted(os.sched_getaffinity(0))
    return {cores[-1]}, set(cores[:-1])


def isolate(mode: str, daemon_pid: int, load_pid: int) -> dict[str, Any]:
    """Apply `mode` to the running daemon, its workers (its children) and the load
    process; what was set, for the report."""
    if mode not in MODES:
        raise ValueError(f"isolation must be one of {', '.join(MODES)}, not {mode!r}")
    workers = [p.pid for p in psutil.Process(daemon_pid).children(recursive=True)]
    out: dict[str, Any] = {"mode": mode, "workers": len(workers)}
    if mode == "none":
        return out
    set_nice(load_pid, CLIENT_NICE)
    for pid in workers:
        set_nice(pid, WORKER_NICE)
    out["nice"] = {"daemon": os.getpriority(os.PRIO_PROCESS, daemon_pid),
                   "workers": WORKER_NICE, "load": CLIENT_NICE}
    if mode == "pin":
        mine, rest = split_cores()
        set_cores(daemon_pid, mine | rest)
        for pid in [*workers, load_pid, os.getpid()]:
            set_cores(pid, rest)
        out["cores"] = {"daemon_only": sorted(mine), "shared": sorted(rest)}
    return out
