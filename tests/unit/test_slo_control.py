"""The daemon's SLO loop on a real Core and store (no workers started): the meta loop's
switch, rollback and bypass reach the live queue and the trace with their reasons."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from daemon.config import Config
from daemon.core import Core
from daemon.state import WorkerState
from db import models
from db.engine import make_engine, make_sessionmaker, sqlite_url, upgrade
from db.writer import BatchWriter
from scheduling.slo_metrics import CompletionRecord

WORKER = "w-0"


@pytest.fixture
async def make_core(tmp_path: Path) -> AsyncIterator[Any]:
    url = sqlite_url(tmp_path / "agentd.db")
    await upgrade(url)
    engine = make_engine(url)
    writer = BatchWriter(engine)
    writer.start()
    sessions = make_sessionmaker(engine)

    def make(**config: Any) -> Core:
        core = Core(Config(data_dir=str(tmp_path), **config), writer, sessions)
        now = time.time()
        core.workers[WORKER] = WorkerState(WORKER, WORKER.encode(), "sim", "m", 8192, 16, 64,
                                           1, "h", now, now)
        return core

    yield make
    await writer.stop()
    await engine.dispose()


def done(n: int, now: float, ttft_s: float, out: int = 5, slo_ttft_s: float = 4.0
         ) -> CompletionRecord:
    return CompletionRecord(f"r{n}", "default", WORKER, now - ttft_s - 1, now, 50, out, ttft_s,
                            0.01, slo_ttft_s, 0.1)


async def events(core: Core, prefix: str) -> list[dict[str, Any]]:
    await core.writer.flush()
    async with core.sessions() as s:
        rows = await s.scalars(select(models.TraceEvent).where(
            models.TraceEvent.kind.startswith(prefix)).order_by(models.TraceEvent.id))
        return [{"kind": r.kind, **r.data} for r in rows]


async def test_violations_alone_do_not_bypass_by_default(make_core: Any) -> None:
    # Late completions are what serving a backlog looks like (bench/slo.py): FCFS with
    # unbounded admission would make them worse.
    core = make_core(ordering_policy="sjf")
    now = time.time()
    for n in range(12):
        core.slo.views.on_completion(done(n, now, ttft_s=9.0))
    core.slo.tick(now)
    assert not core.slo.bypass


async def test_bypass_runs_fcfs_unbounded_until_calm(make_core: Any) -> None:
    core = make_core(ordering_policy="sjf", slo={"guard": {"bypass_violation": 0.5}})
    now = time.time()
    for n in range(12):
        core.slo.views.on_completion(done(n, now, ttft_s=9.0))  # every one late
    core.slo.tick(now)
    assert core.slo.bypass and core.slo.ordered.policy_name == "fcfs"
    assert core.slo.controls[WORKER].unbounded
    # Calm (no recent completions, empty queue) must hold for clear_hold_s (10 s).
    core.slo.tick(now + 20)
    assert core.slo.bypass
    core.slo.tick(now + 31)
    assert not core.slo.bypass and core.slo.ordered.policy_name == "sjf"
    on, off = await events(core, "meta.bypass")
    assert on["active"] and on["policy"] == "fcfs" and "violations 100%" in on["reason"]
    assert not off["active"] and off["policy"] == "sjf" and "calm" in off["reason"]
    assert core.slo.stats.bypasses == 1


async def test_switch_then_rollback_when_ttft_gets_worse(make_core: Any) -> None:
    core = make_core(meta_interval_s=60.0, slo={
        "rules": {"min_completions": 5},
        "guard": {"min_completions": 5, "bypass_violation": 1.01}})
    now = time.time()
    for n in range(8):
        core.slo.views.on_completion(done(n, now, ttft_s=0.5))
    for n in range(8, 10):  # two long ones, within their own SLO
        core.slo.views.on_completion(done(n, now, ttft_s=10.0, out=2000, slo_ttft_s=12.0))
    for n in range(10, 12):  # two short ones stuck behind them
        core.slo.views.on_completion(done(n, now, ttft_s=6.0))
    core.slo.tick(now)
    assert core.slo.ordered.policy_name == "two_lane"
    for n in range(20, 30):  # after the switch: far slower first tokens
        core.slo.views.on_completion(done(n, now + 1, ttft_s=60.0))
    core.slo.tick(now + 1)
    assert core.slo.ordered.policy_name == "fcfs"
    switch, rollback = await events(core, "ordering.")
    assert switch["kind"] == "ordering.switch" and switch["previous"] == "fcfs"
    assert switch["reason"].startswith("HOL blocking") and switch["meta"] == "meta-rules"
    assert rollback["kind"] == "ordering.rollback" and rollback["rolled_back"] == "two_lane"
    assert rollback["policy"] == "fcfs" and rollback["reason"].startswith("TTFT p99 60.000s")
    assert (core.slo.stats.switches, core.slo.stats.rollbacks) == (1, 1)


async def test_meta_off_never_switches_or_bypasses(make_core: Any) -> None:
    core = make_core(meta_policy="edf")
    now = time.time()
    for n in range(12):
        core.slo.views.on_completion(done(n, now, ttft_s=9.0))
    core.slo.tick(now)
    assert core.slo.ordered.policy_name == "edf" and not core.slo.bypass
    assert not await events(core, "ordering.") and not await events(core, "meta.")
