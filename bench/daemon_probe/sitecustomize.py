"""Measurements inside the agentd processes bench/policy_swap.py starts; it only measures.

On PYTHONPATH only for that daemon (and the workers it spawns), with AGENTD_BENCH_PROBE
naming a directory, one file per process (`<role>-<pid>.jsonl`, role `start` for the
daemon, `worker`):
- every garbage collection of 1 ms or more: {"gc": generation, "end", "wall", "cpu"};
- in the daemon, each SLO and KV scheduling tick (`SloControl.tick`, `KvControl.tick`,
  which run on the loop without awaiting) of 1 ms or more: {"tick", "end", "wall",
  "cpu", "gc_wall"}, the daemon's own periodic hold on the loop, swaps or not.
How long each policy change holds the loop the daemon says itself (`loop_hold` in the
answer, daemon/policies/loop_hold.py).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

MIN_GC_WALL_S = 0.001
MIN_TICK_WALL_S = 0.001


class _Probe:
    def __init__(self, directory: str) -> None:
        self.role = next((a for a in sys.argv[1:] if not a.startswith("-")), "python")
        path = os.path.join(directory, f"{self.role}-{os.getpid()}.jsonl")
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self.gc_wall = 0.0  # collection time so far (any thread; nearly all the loop's)
        self._start = (0.0, 0.0)
        gc.callbacks.append(self.on_collection)

    def write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = (time.perf_counter(), time.thread_time())
            return
        wall = time.perf_counter() - self._start[0]
        self.gc_wall += wall
        if wall >= MIN_GC_WALL_S:
            self.write({"gc": info["generation"], "end": time.time(), "wall": wall,
                        "cpu": time.thread_time() - self._start[1]})


def _timed_tick(probe: _Probe, tick: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu, gc_wall = time.perf_counter(), time.thread_time(), probe.gc_wall
        try:
            return method(*args, **kwargs)
        finally:
            spent = time.perf_counter() - wall
            if spent >= MIN_TICK_WALL_S:
                probe.write({"tick": tick, "end": time.time(), "wall": spent,
                             "cpu": time.thread_time() - cpu, "gc_wall": probe.gc_wall - gc_wall})
    return wrapper


def _install(directory: str) -> None:
    probe = _Probe(directory)
    if probe.role != "start":
        return
    from daemon.kv_control import KvControl
    from daemon.slo_control import SloControl

    SloControl.tick = _timed_tick(probe, "slo", SloControl.tick)  # type: ignore[method-assign]
    KvControl.tick = _timed_tick(probe, "kv", KvControl.tick)  # type: ignore[method-assign]


if os.environ.get("AGENTD_BENCH_PROBE"):
    _install(os.environ["AGENTD_BENCH_PROBE"])
