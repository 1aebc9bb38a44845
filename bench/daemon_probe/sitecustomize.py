"""Measurements inside the agentd processes bench/policy_swap.py starts; it only measures.

On PYTHONPATH only for that daemon (and the workers it spawns), with AGENTD_BENCH_PROBE
naming a directory, one file per process (`<role>-<pid>.jsonl`, role `start` for the
daemon, `worker`):
- every garbage collection of 1 ms or more: {"gc": generation, "end", "wall", "cpu"};
  with, for a full collection (generation 2) in the daemon, what it walked: the objects
  tracked in generation 2 by type, the most numerous first ("census"; counted before it
  starts, so the count is not in its time);
- in the daemon, each SLO and KV scheduling tick (`SloControl.tick`, `KvControl.tick`,
  which run on the loop without awaiting) of 1 ms or more: {"tick", "end", "wall",
  "cpu", "gc_wall"}, the daemon's own periodic hold on the loop, swaps or not;
- in the daemon, the event loop's lag (daemon_probe/probe_loop_watch.py): every time a 1 ms
  timer ran `MIN_LAG_S` or more late, {"lag", "end", "where"}: how long anything that
  became ready then (a request's bytes, a worker's answer) waited for the loop, with
  where the loop thread was while it waited (sampled from another thread);
- in the daemon, per request (daemon_probe/probe_intake.py, `<role>-<pid>.requests.jsonl`):
  when the loop read its HTTP headers, when it was queued, when it was dispatched and
  whether by its own submit or by a later pump (a slot opened);
- in the daemon, when the app stops: {"exit": {"frozen", "thaws", "garbage_found"}}:
  the objects frozen then (daemon/core/interpreter_tuning.py), how often they were thawed
  for a full walk, and the unreachable objects a full collection finds once they are
  unfrozen (cyclic garbage that waited frozen, plus the young generations' garbage);
- in the daemon, each bearer-token lookup that went to the store (`TokenAuth._record`
  taking 0.5 ms or more; a cached one takes microseconds): {"await": "token lookup",
  "end", "wall"}, a wait a request spends off the loop before it is queued.
How long each policy change holds the loop the daemon says itself (`loop_hold` in the
answer, daemon/policies/loop_hold.py).
"""

from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

MIN_GC_WALL_S = 0.001
MIN_TICK_WALL_S = 0.001
MIN_AWAIT_S = 0.0005


class _Probe:
    def __init__(self, directory: str) -> None:
        self.role = next((a for a in sys.argv[1:] if not a.startswith("-")), "python")
        self.path = os.path.join(directory, f"{self.role}-{os.getpid()}")
        self.out = open(f"{self.path}.jsonl", "a", buffering=1)  # noqa: SIM115 - process life
        self.gc_wall = 0.0  # collection time so far (any thread; nearly all the loop's)
        self._start = (0.0, 0.0)
        self._census: dict[str, int] = {}
        gc.callbacks.append(self.on_collection)

    def write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._census = _census() if info["generation"] == 2 and self.role == "start" else {}
            self._start = (time.perf_counter(), time.thread_time())
            return
        wall = time.perf_counter() - self._start[0]
        self.gc_wall += wall
        if wall >= MIN_GC_WALL_S:
            self.write({"gc": info["generation"], "end": time.time(), "wall": wall,
                        "cpu": time.thread_time() - self._start[1], "census": self._census})


def _census(top: int = 15) -> dict[str, int]:
    counts = Counter(type(o).__qualname__ for o in gc.get_objects(generation=2))
    return {"total": sum(counts.values()), **dict(counts.most_common(top))}


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


def _timed_await(probe: _Probe, what: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            spent = time.perf_counter() - wall
            if spent >= MIN_AWAIT_S:
                probe.write({"await": what, "end": time.time(), "wall": spent})
    return wrapper


def _probe_release(probe: _Probe) -> None:
    from daemon.core import interpreter_tuning

    release = interpreter_tuning.release_on_stop

    def measured(before: Any) -> None:
        frozen = gc.get_freeze_count()
        thaws = before.ageing.thaws if before.ageing is not None else 0
        release(before)
        probe.write({"exit": {"frozen": frozen, "thaws": thaws, "garbage_found": gc.collect()}})

    interpreter_tuning.release_on_stop = measured


def _install(directory: str) -> None:
    probe = _Probe(directory)
    if probe.role != "start":
        return
    from probe_intake import install_intake
    from probe_loop_watch import LoopWatch

    from daemon.access.auth import TokenAuth
    from daemon.core.core import Core
    from daemon.kv.loop import KvControl
    from daemon.slo.stack import SloControl

    SloControl.tick = _timed_tick(probe, "slo", SloControl.tick)  # type: ignore[method-assign]
    KvControl.tick = _timed_tick(probe, "kv", KvControl.tick)  # type: ignore[method-assign]
    TokenAuth._record = _timed_await(  # type: ignore[method-assign]
        probe, "token lookup", TokenAuth._record)
    _probe_release(probe)
    requests = open(f"{probe.path}.requests.jsonl", "a")  # noqa: SIM115 - flushed at exit
    atexit.register(requests.close)
    install_intake(requests)
    start = Core.start

    async def start_and_watch(self: Core) -> None:
        LoopWatch(probe.write).start()  # on the loop: Core.start runs in the lifespan
        await start(self)

    Core.start = start_and_watch  # type: ignore[method-assign]


if os.environ.get("AGENTD_BENCH_PROBE"):
    _install(os.environ["AGENTD_BENCH_PROBE"])
