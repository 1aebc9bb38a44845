"""The daemon's event-loop lag, and where the loop was while it lagged (bench probe).

A timer asks to run every `BEAT_S`; how late it runs is how long anything that became
ready meanwhile (a request's bytes, a worker's answer, a slot to dispatch into) waited
for the loop: one long callback, or many short ones in one turn of the loop. Lags of
`MIN_LAG_S` or more are written with where the loop thread was during them: a thread
of this probe looks at the loop thread's stack every `SAMPLE_S` once the timer is
`SAMPLE_AFTER_S` overdue, and counts each place (the innermost frame of the project's
code, and the innermost frame). The daemon runs on uvloop, whose callbacks cannot be
wrapped one by one, so the stall is seen from outside. Each lag also says how the loop
thread spent it (/proc/thread-self/schedstat since the last beat): `cpu` on a CPU (the
daemon's own work), `runq` waiting for one (the machine's doing), the rest blocked (a
system call, or waiting for the GIL another thread holds). A sample that finds the
thread outside any Python frame of a callback (`runners.py ... run`) is such a wait.

The sampling thread takes the GIL for a few microseconds each `SAMPLE_S`; it is the
probe's cost to the loop.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

BEAT_S = 0.001
MIN_LAG_S = 0.004  # uvloop's timers have millisecond resolution: below this is the timer
SAMPLE_S = 0.002
SAMPLE_AFTER_S = 0.003
ROOT = str(Path(__file__).resolve().parents[2])
VENV = f"{ROOT}/.venv"


def where(frame: FrameType | None) -> str:
    """`project file:line function <- innermost file:line function` for a stack."""
    inner = _name(frame) if frame is not None else "?"
    f = frame
    while f is not None:
        path = f.f_code.co_filename
        if path.startswith(ROOT) and not path.startswith(VENV) and "daemon_probe" not in path:
            mine = _name(f)
            return mine if mine == inner else f"{mine} <- {inner}"
        f = f.f_back
    return inner


def _name(f: FrameType) -> str:
    path = f.f_code.co_filename
    short = path[len(ROOT) + 1:] if path.startswith(ROOT) else path.rsplit("/", 2)[-1]
    return f"{short.removeprefix('.venv/lib/python3.11/site-packages/')}:{f.f_lineno} " \
           f"{f.f_code.co_name}"


class LoopWatch:
    """Start on the daemon's loop thread; runs as long as the loop does."""

    def __init__(self, write: Callable[[dict[str, Any]], None]) -> None:
        self.write = write
        self.due = 0.0
        self.samples: Counter[str] = Counter()
        self.thread_id = threading.get_ident()
        self.loop = asyncio.get_running_loop()
        self.stopped = False
        self._stat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        self._last = self._schedstat()

    def _schedstat(self) -> tuple[int, int]:
        """(ns on a CPU, ns waiting for one) of the loop thread so far."""
        run, wait, _ = os.pread(self._stat, 100, 0).split()
        return int(run), int(wait)

    def start(self) -> None:
        self.due = time.perf_counter() + BEAT_S
        self.loop.call_later(BEAT_S, self.beat)
        threading.Thread(target=self._sample, name="probe-loop-watch", daemon=True).start()

    def stop(self) -> None:
        self.stopped = True
        os.close(self._stat)

    def beat(self) -> None:
        if self.stopped:
            return
        now = time.perf_counter()
        lag, stat = now - self.due, self._schedstat()
        if lag >= MIN_LAG_S:
            self.write({"lag": lag, "end": time.time(), "where": dict(self.samples),
                        "cpu": (stat[0] - self._last[0]) / 1e9,
                        "runq": (stat[1] - self._last[1]) / 1e9})
        self._last = stat
        self.samples = Counter()
        self.due = now + BEAT_S
        self.loop.call_later(BEAT_S, self.beat)

    def _sample(self) -> None:
        while not (self.stopped or self.loop.is_closed()):
            time.sleep(SAMPLE_S)
            if time.perf_counter() - self.due > SAMPLE_AFTER_S:
                frame = sys._current_frames().get(self.thread_id)
                self.samples[where(frame)] += 1
