"""Time spent in policy code, less garbage collection.

The interpreter runs a collection inside whichever call allocates when a threshold is
crossed. In the daemon, whose heap holds every live request, a full collection takes
100+ ms of CPU (measured under bench/policy_swap.py); charged to the policy that happened
to be running, it fails a sound policy's budget and rolls it back. These clocks leave out
the collections that ran on the calling thread.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any


class _Collections(threading.local):
    """Time this thread spent in collections so far (class values are each thread's start)."""

    cpu = 0.0
    wall = 0.0
    cpu_start = 0.0
    wall_start = 0.0


_SPENT = _Collections()


def _on_collection(phase: str, _info: dict[str, Any]) -> None:
    if phase == "start":
        _SPENT.cpu_start, _SPENT.wall_start = time.thread_time(), time.perf_counter()
    else:
        _SPENT.cpu += time.thread_time() - _SPENT.cpu_start
        _SPENT.wall += time.perf_counter() - _SPENT.wall_start


def cpu_time() -> float:
    """This thread's CPU time in seconds, less its garbage collections."""
    return time.thread_time() - _SPENT.cpu


def wall_time() -> float:
    """A monotonic wall clock in seconds that stands still while this thread collects."""
    return time.perf_counter() - _SPENT.wall


if not any(getattr(cb, "__qualname__", "") == _on_collection.__qualname__
           and getattr(cb, "__module__", "") == __name__ for cb in gc.callbacks):
    gc.callbacks.append(_on_collection)
