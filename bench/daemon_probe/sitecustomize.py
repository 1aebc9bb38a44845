"""Measurements inside the agentd processes bench/policy_swap.py starts; it only measures.

On PYTHONPATH only for that daemon (and the workers it spawns), with AGENTD_BENCH_PROBE
naming a directory, one file per process (`<role>-<pid>.jsonl`, role `start` for the
daemon, `worker`):
- every garbage collection of 1 ms or more: {"gc": generation, "end", "wall", "cpu"};
- in the daemon, every `PolicyService.put` and `.activate` (daemon/policies/registry.py)
  driven step by step: each step is a stretch the request holds the event loop without
  awaiting, so the longest one is the longest the swap kept the daemon from doing
  anything else, dispatching included: {"call", "name", "end", "steps": [[wall, cpu,
  gc_wall, gc_cpu], ...]} (seconds; gc_* is collection time inside the step);
- in the daemon, each SLO and KV scheduling tick (`SloControl.tick`, `KvControl.tick`,
  which run on the loop without awaiting) of 1 ms or more: {"tick", "end", "wall",
  "cpu", "gc_wall"}, the daemon's own periodic hold on the loop, swaps or not.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any

MIN_GC_WALL_S = 0.001
MIN_TICK_WALL_S = 0.001


class _Probe:
    def __init__(self, directory: str) -> None:
        self.role = next((a for a in sys.argv[1:] if not a.startswith("-")), "python")
        path = os.path.join(directory, f"{self.role}-{os.getpid()}.jsonl")
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        # collection time so far (any thread; in the daemon nearly all on the loop's)
        self.gc_wall = 0.0
        self.gc_cpu = 0.0
        self._start = (0.0, 0.0)
        gc.callbacks.append(self.on_collection)

    def write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = (time.perf_counter(), time.thread_time())
            return
        wall = time.perf_counter() - self._start[0]
        cpu = time.thread_time() - self._start[1]
        self.gc_wall += wall
        self.gc_cpu += cpu
        if wall >= MIN_GC_WALL_S:
            self.write({"gc": info["generation"], "end": time.time(), "wall": wall,
                        "cpu": cpu})


class _Steps:
    """Await a coroutine, timing each stretch between two of its suspensions."""

    def __init__(self, probe: _Probe, coro: Coroutine[Any, Any, Any]) -> None:
        self.probe, self.coro = probe, coro
        self.steps: list[list[float]] = []

    def _note(self, wall: float, cpu: float, gc_wall: float, gc_cpu: float) -> None:
        self.steps.append([time.perf_counter() - wall, time.thread_time() - cpu,
                           self.probe.gc_wall - gc_wall, self.probe.gc_cpu - gc_cpu])

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            marks = (time.perf_counter(), time.thread_time(), self.probe.gc_wall,
                     self.probe.gc_cpu)
            try:
                yielded = self.coro.throw(error) if error is not None else self.coro.send(value)
            except StopIteration as stop:
                self._note(*marks)
                return stop.value
            except BaseException:
                self._note(*marks)
                raise
            self._note(*marks)
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # thrown into the task: hand it to the coroutine
                value, error = None, exc


def _stepped(probe: _Probe, call: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapper(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        steps = _Steps(probe, method(self, name, *args, **kwargs))
        try:
            return await steps
        finally:
            probe.write({"call": call, "name": name, "end": time.time(), "steps": steps.steps})
    return wrapper


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
    from daemon.policies.registry import PolicyService
    from daemon.slo_control import SloControl

    for call in ("put", "activate"):
        setattr(PolicyService, call, _stepped(probe, call, getattr(PolicyService, call)))
    SloControl.tick = _timed_tick(probe, "slo", SloControl.tick)  # type: ignore[method-assign]
    KvControl.tick = _timed_tick(probe, "kv", KvControl.tick)  # type: ignore[method-assign]


if os.environ.get("AGENTD_BENCH_PROBE"):
    _install(os.environ["AGENTD_BENCH_PROBE"])
