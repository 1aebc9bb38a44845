"""The daemon's SLO loop on a real Core and store (no workers started): the meta loop's
switch, rollback and bypass reach the live queue and the trace with their reasons; the
long view they rest on is built off the event loop and a choice never uses a stale one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from daemon.config import Config
from daemon.core.core import Core
from daemon.policies.clock import cpu_time
from daemon.policies.loop_hold import LOOP_HOLD_BUDGET_S
from daemon.state import WorkerState
from db import models
from scheduling.slo.metrics import CompletionRecord
from tests.store_fixtures import Store

WORKER = "w-0"


@pytest.fixture
def make_core(tmp_path: Path, store_with_writer: Store) -> Any:
    writer, sessions = store_with_writer

    def make(**config: Any) -> Core:
        core = Core(Config(data_dir=str(tmp_path), **config), writer, sessions)
        now = time.time()
        core.workers[WORKER] = WorkerState(WORKER, WORKER.encode(), "sim", "m", 8192, 16, 64,
                                           1, "h", now, now)
        return core

    return make


def done(n: int, now: float, ttft_s: float, out: int = 5, slo_ttft_s: float = 4.0
         ) -> CompletionRecord:
    return CompletionRecord(f"r{n}", "default", WORKER, now - ttft_s - 1, now, 50, out, ttft_s,
                            0.01, slo_ttft_s, 0.1)


async def cycle(core: Core, now: float) -> None:
    """One scheduling cycle and the long view it asked for: the meta choice lands with it."""
    core.slo.tick(now)
    await core.slo.long.settled()


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
    await cycle(core, now)
    assert not core.slo.bypass


async def test_bypass_runs_fcfs_unbounded_until_calm(make_core: Any) -> None:
    core = make_core(ordering_policy="sjf", slo={"guard": {"bypass_violation": 0.5}})
    now = time.time()
    for n in range(12):
        core.slo.views.on_completion(done(n, now, ttft_s=9.0))  # every one late
    await cycle(core, now)
    assert core.slo.bypass and core.slo.ordered.policy_name == "fcfs"
    assert core.slo.controls[WORKER].unbounded
    # Calm (no recent completions, empty queue) must hold for clear_hold_s (10 s).
    await cycle(core, now + 20)
    assert core.slo.bypass
    await cycle(core, now + 31)
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
    await cycle(core, now)
    assert core.slo.ordered.policy_name == "two_lane"
    for n in range(20, 30):  # after the switch: far slower first tokens
        core.slo.views.on_completion(done(n, now + 1, ttft_s=60.0))
    await cycle(core, now + 1)
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
    await cycle(core, now)
    assert core.slo.ordered.policy_name == "edf" and not core.slo.bypass
    assert not await events(core, "ordering.") and not await events(core, "meta.")


def hol_blocking(core: Core, now: float) -> None:
    """Completions whose long view makes the rule map pick two-lane."""
    for n in range(8):
        core.slo.views.on_completion(done(n, now, ttft_s=0.5))
    for n in range(8, 10):
        core.slo.views.on_completion(done(n, now, ttft_s=10.0, out=2000, slo_ttft_s=12.0))
    for n in range(10, 12):
        core.slo.views.on_completion(done(n, now, ttft_s=6.0))


SWITCHING = {"meta_interval_s": 2.0, "slo": {
    "rules": {"min_completions": 5}, "guard": {"min_completions": 5, "bypass_violation": 1.01}}}


async def test_the_choice_waits_off_the_loop_for_its_view(make_core: Any) -> None:
    core = make_core(**SWITCHING)
    now = time.time()
    hol_blocking(core, now)
    core.slo.tick(now)
    # The cycle only copied the windows; the view is still being built, so no choice yet.
    assert core.slo.long.in_flight and core.slo.ordered.policy_name == "fcfs"
    core.slo.tick(now + 0.1)  # a cycle while the build runs starts no second one
    assert core.slo.long.skipped == 1
    await core.slo.long.settled()
    assert core.slo.ordered.policy_name == "two_lane"  # applied as soon as it landed
    assert (core.slo.long.builds, core.slo.long.stale) == (1, 0)
    assert core.slo.long.latest is not None and core.slo.long.latest.taken_at == now


async def test_a_view_older_than_one_interval_is_never_chosen_on(make_core: Any) -> None:
    core = make_core(**SWITCHING)
    now = time.time()
    hol_blocking(core, now)
    core.slo.long.request(now - 5.0)  # a copy taken 2.5 intervals ago
    await core.slo.long.settled()
    assert core.slo.long.stale == 1 and core.slo.ordered.policy_name == "fcfs"
    assert not await events(core, "ordering.")
    await cycle(core, now)  # the next cycle asks for a view of now and chooses on it
    assert core.slo.ordered.policy_name == "two_lane"
    [switch] = await events(core, "ordering.switch")
    assert switch["reason"].startswith("HOL blocking")


async def test_status_reads_the_last_view_and_builds_none(make_core: Any) -> None:
    core = make_core(**SWITCHING)
    now = time.time()
    hol_blocking(core, now)
    empty = core.slo.status(now)["window"]
    assert empty["completions"] == 0 and empty["view"]["taken_at"] is None
    await cycle(core, now)
    window = core.slo.status(now + 0.5)["window"]
    assert window["completions"] == 12 and window["view"]["taken_at"] == now
    assert window["view"]["age_s"] == 0.5 and window["view"]["builds"] == 1
    for n in range(100, 110):
        core.slo.views.on_completion(done(n, now + 1, ttft_s=0.5))
    assert core.slo.status(now + 1)["window"]["completions"] == 12  # no build per request
    assert not core.slo.long.in_flight
    await cycle(core, now + 1)  # a cycle within the interval keeps the view it has
    assert core.slo.long.builds == 1
    await cycle(core, now + 2.5)  # older than one interval: the cycle refreshes it
    window = core.slo.status(now + 2.5)["window"]
    assert window["completions"] == 22 and window["view"]["taken_at"] == now + 2.5



class LoopSteps:
    """Times every callback the event loop runs (each task step is one), as
    daemon/policies/loop_hold.py times a call's steps: the loop thread's CPU, less garbage
    collection. A dispatch waits for whichever step holds the loop when it is due."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps, self.longest_s = 0, 0.0
        run = asyncio.events.Handle._run

        def timed(handle: asyncio.events.Handle) -> None:
            start = cpu_time()
            try:
                run(handle)
            finally:
                self.steps += 1
                self.longest_s = max(self.longest_s, cpu_time() - start)

        monkeypatch.setattr(asyncio.events.Handle, "_run", timed)


async def test_the_meta_tick_holds_the_loop_under_10_ms_at_30000_completions(
        make_core: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(**SWITCHING)
    now = time.time()
    views = core.slo.views
    for n in range(30_000):  # one every 2 ms across the 60 s long window, head-of-line blocked
        at = now - 60 + 0.002 * (n + 1)
        views.on_arrival(at)
        late, long_one = n % 7 == 0, n % 7 == 1
        views.on_completion(done(n, at, ttft_s=6.0 if late else 0.5,
                                 out=2000 if long_one else 5, slo_ttft_s=12.0 if long_one else 4.0))
    loop = LoopSteps(monkeypatch)
    await asyncio.sleep(0)  # the cycle starts a step of its own, as under SloControl.run
    core.slo.tick(now)
    await core.slo.long.settled()
    meta_tick = (loop.steps, loop.longest_s)
    switches = [e["policy"] for e in await events(core, "ordering.switch")]
    assert core.slo.ordered.policy_name == "two_lane" and switches == ["two_lane"]
    assert core.slo.long.latest is not None and core.slo.long.latest.view.completions == 30_000
    assert meta_tick[0] >= 3 and meta_tick[1] <= LOOP_HOLD_BUDGET_S, meta_tick
