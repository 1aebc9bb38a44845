"""The swap benchmark's daemon-side stall figures and its client isolation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from bench.policy_swap_daemon_side import (
    Waits,
    lag_summary,
    per_request,
    request_waits,
    store_waits,
    window_waits,
)
from bench.policy_swap_isolation import CLIENT_NICE, WORKER_NICE, isolate, split_cores
from tests.waiting import wait_for, wait_for_async

# Stand-ins for the daemon, its worker and the load generator: processes that stay alive
# (sleeping) while the test pins them, not waits on anything.
IDLE = "import time; time.sleep(30)"


def test_longest_wait_is_the_longest_interval_overlapping_the_window() -> None:
    waits = Waits([(0.0, 0.5), (1.0, 1.002), (1.001, 1.030), (2.0, 2.001), (0.9, 3.0)])
    assert waits.longest_in(1.0, 1.01) == pytest.approx(2.1)  # (0.9, 3.0) spans it
    without_long = Waits([(0.0, 0.5), (1.0, 1.002), (1.001, 1.030), (2.0, 2.001)])
    assert without_long.longest_in(1.0, 1.01) == pytest.approx(0.029)
    assert without_long.longest_in(1.5, 1.9) == 0.0  # nothing waited then
    assert without_long.longest_in(0.4, 0.45) == pytest.approx(0.5)  # began before it


def test_a_request_dispatched_later_leaves_its_wait_for_a_slot_out() -> None:
    # arrived (body in), queued, pump, dispatched, own, headers in
    own = [10.0, 10.002, 10.002, 10.003, True, 9.98]
    later = [11.0, 11.004, 11.5, 11.5005, False, 11.0]  # waited 496 ms for a slot
    waits, slots = request_waits([own, later])
    assert waits == [(10.0, 10.003), (11.0, 11.004), (11.5, 11.5005)]
    assert slots == [pytest.approx(0.496)]
    out = per_request([own, later], {"all": (0.0, 20.0), "none": (30.0, 40.0)})
    assert out["all"]["daemon_wait_ms"]["max"] == pytest.approx(4.5, abs=1e-3)
    assert out["all"]["over_10ms"] == 0
    assert out["all"]["dispatched_later"] == 1
    assert out["all"]["slot_wait_ms"]["max"] == pytest.approx(496.0, abs=1e-3)
    assert out["all"]["headers_to_body_ms"]["max"] == pytest.approx(20.0, abs=1e-3)
    assert out["none"]["daemon_wait_ms"]["n"] == 0


def test_window_stalls_count_the_windows_over_the_target() -> None:
    waits = Waits([(5.0, 5.02), (6.0, 6.001)])
    out = window_waits(waits, [(5.01, 5.011), (6.0, 6.0005)], phase=(100.0, 101.0))
    assert out["stall_ms"]["max"] == pytest.approx(20.0)
    assert out["over_10ms"] == 1
    assert out["baseline_stall_ms"]["max"] == 0.0  # nothing waited in the baseline phase


def test_lags_over_the_target_say_where_the_loop_was() -> None:
    records = [{"lag": 0.005, "end": 1.0, "where": {}},
               {"lag": 0.030, "end": 2.0, "where": {"daemon/x.py:3 f": 4}},
               {"lag": 0.012, "end": 3.0, "where": {"daemon/x.py:3 f": 1, "db/y.py:9 g": 2}}]
    out = lag_summary(records, {"p": (0.0, 10.0)})["p"]
    assert out["over_10ms"] == 2
    assert out["over_10ms_where"] == {"daemon/x.py:3 f": 5, "db/y.py:9 g": 2}
    assert out["lag_ms"]["max"] == pytest.approx(30.0)


def test_store_waits_tell_which_long_waits_overlap_a_token_lookup() -> None:
    lookups = [{"await": "token lookup", "end": 1.015, "wall": 0.012}]
    waits = [(1.0, 1.02), (2.0, 2.03), (3.0, 3.001)]
    out = store_waits(lookups, waits, {"p": (0.0, 10.0)})["p"]
    assert out["daemon_waits_over_10ms"] == 2
    assert out["of_which_overlap_a_lookup"] == 1
    assert out["token_lookup_ms"]["max"] == pytest.approx(12.0)


def _tids(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


def _nice(tid: int) -> int:
    return int(Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores")
def test_pin_keeps_workers_and_clients_off_the_daemons_core() -> None:
    spawner = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {IDLE!r}]); {IDLE}"
    daemon = subprocess.Popen([sys.executable, "-c", spawner])
    load = subprocess.Popen([sys.executable, "-c", IDLE])
    mine = {t: os.sched_getaffinity(t) for t in _tids(os.getpid())}
    try:
        children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children")
        [worker] = [int(p) for p in wait_for(lambda: children.read_text().split(), 10,
                                             "the stand-in daemon to start its worker",
                                             interval=0.05)]
        only, shared = split_cores()  # before: it reads this process's cores, which pin changes
        out = isolate("pin", daemon.pid, load.pid)
        assert out["workers"] == 1 and out["cores"]["daemon_only"] == sorted(only)
        assert os.sched_getaffinity(daemon.pid) == only | shared
        for pid in (worker, load.pid, os.getpid()):
            assert os.sched_getaffinity(pid) == shared
        assert {_nice(t) for t in _tids(load.pid)} == {CLIENT_NICE}
        assert {_nice(t) for t in _tids(worker)} == {WORKER_NICE}
        assert _nice(daemon.pid) == _nice(os.getpid())
    finally:
        for tid, cores in mine.items():
            os.sched_setaffinity(tid, cores)
        for p in (daemon, load):
            p.kill()
            p.wait()


def test_none_changes_nothing_and_a_bad_mode_is_refused() -> None:
    load = subprocess.Popen([sys.executable, "-c", IDLE])
    try:
        before = os.sched_getaffinity(load.pid)
        assert isolate("none", os.getpid(), load.pid)["mode"] == "none"
        assert os.sched_getaffinity(load.pid) == before
        assert _nice(load.pid) == _nice(os.getpid())
        with pytest.raises(ValueError, match="isolation must be one of"):
            isolate("spread", os.getpid(), load.pid)
    finally:
        load.kill()
        load.wait()


def _loop_watch_module() -> ModuleType:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench/daemon_probe/probe_loop_watch.py"
    spec = importlib.util.spec_from_file_location("probe_loop_watch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hold_the_loop() -> None:
    time.sleep(0.06)  # blocks the loop thread as a long callback would


async def test_the_loop_watch_records_a_lag_and_where_the_loop_was() -> None:
    import asyncio

    records: list[dict[str, object]] = []
    watch = _loop_watch_module().LoopWatch(records.append)
    watch.start()
    try:
        asyncio.get_running_loop().call_soon(_hold_the_loop)
        # the next beat after the hold writes it down
        await wait_for_async(lambda: any(r["lag"] > 0.04 for r in records), 5,  # type: ignore[operator]
                             "the lag to be recorded", interval=0.01)
    finally:
        watch.stop()
    [lag] = [r for r in records if r["lag"] > 0.04]  # type: ignore[operator]
    assert lag["lag"] < 0.2  # type: ignore[operator]
    where = lag["where"]
    assert isinstance(where, dict) and where
    assert any("tests/unit/test_policy_swap_bench.py" in k and "_hold_the_loop" in k
               for k in where)
