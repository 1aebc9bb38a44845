"""Ended runs and run tokens leave the daemon's memory: a daemon that kept every run it
ever ran (its events, its sandbox's process objects) and every run token's cache entry
grew ~0.8 MiB a minute under the soak's load (bench/soak.py). The runs go through the
real end of a run (RunController._finish) on a real Core and store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from daemon.access import auth
from daemon.config import Config
from daemon.core.core import Core, new_id
from daemon.runtime import run_records
from daemon.runtime import runs as runs_module
from daemon.runtime.runs import Run, RunController
from tests.store_fixtures import Store

CAP = 8


@pytest.fixture
def store(store_with_writer: Store) -> Store:
    return store_with_writer


@pytest.fixture
def controller(tmp_path: Path, store: Store,
               monkeypatch: pytest.MonkeyPatch) -> RunController:
    monkeypatch.setattr(runs_module, "MAX_ENDED_RUNS", CAP)
    writer, sessions = store
    core = Core(Config(data_dir=str(tmp_path)), writer, sessions)
    return RunController(core, tmp_path, "http://127.0.0.1:1", auth_enabled=False)


async def _start(ctl: RunController, n: int) -> Run:
    """A run as `create` leaves it, its sandbox already exited (a real process)."""
    program = await ctl.core.ensure_program(new_id("prog"), f"s-{n}")
    run = Run(id=new_id("run"), workflow="w", version=1, entry="main:main", args={"n": n},
              program_id=program.id, session_id=program.session_id, limits={}, tenant="t")
    run.proc = await asyncio.create_subprocess_exec("true", stdout=asyncio.subprocess.PIPE)
    await run.proc.communicate()
    run.status, run.started_at = "running", time.time()
    ctl.runs[run.id] = run
    for i in range(20):
        ctl.trace(run, "future.created", id=f"f{i}")
    return run


async def test_ended_runs_beyond_the_cap_leave_memory_and_stay_readable(
        controller: RunController) -> None:
    live = await _start(controller, -1)
    ended = []
    for n in range(3 * CAP):
        run = await _start(controller, n)
        await controller._finish(run, {"ok": True, "result": n})
        ended.append(run)
    assert live.id in controller.runs  # a running run is never let go
    kept = [r for r in controller.runs.values() if r.ended]
    assert [r.id for r in kept] == [r.id for r in ended[-CAP:]]  # the newest ends stay
    assert all(r.proc is None for r in kept)  # their sandbox's pipes are let go at once
    gone = ended[0]
    view = await run_records.recorded(controller.records, gone.id)
    assert view is not None and view["status"] == "finished" and view["result"] == 0
    assert view["events"] == len(gone.events)
    for program in [r.program_id for r in ended]:  # released by the run's end
        assert controller.core.programs[program].status.value == "STOPPED"


async def test_ended_runs_past_their_keep_time_leave_memory(controller: RunController) -> None:
    live = await _start(controller, -1)
    runs = [await _start(controller, n) for n in range(3)]
    for run in runs:
        await controller._finish(run, {"ok": False, "kind": "user", "reason": "boom"})
    assert len(controller.runs) == 4
    controller.retire(time.time() + runs_module.ENDED_RUN_KEEP_S / 2)
    assert len(controller.runs) == 4
    controller.retire(time.time() + runs_module.ENDED_RUN_KEEP_S + 1)
    assert list(controller.runs) == [live.id]
    view = await run_records.recorded(controller.records, runs[1].id)
    assert view is not None and view["status"] == "failed"


@pytest.mark.parametrize("run_id", ["../agentd", "run-123", "run-0123456789abcdef/../x", ""])
async def test_a_record_is_read_only_for_a_run_id(controller: RunController,
                                                  run_id: str) -> None:
    (controller.records / "agentd.json").parent.mkdir(parents=True, exist_ok=True)
    (controller.records / "agentd.json").write_text("{}")
    assert await run_records.recorded(controller.records, run_id) is None


async def test_token_cache_keeps_only_entries_within_its_ttl(
        store: Store) -> None:
    """One run token after another, each looked up for a while and never again (what
    runs do): the cache holds what was looked up within the TTL, not every token."""
    _, sessions = store
    now = [100.0]
    checker = auth.TokenAuth(enabled=True, ttl_s=1.0, clock=lambda: now[0])
    checker.bind(sessions)
    for _ in range(30):
        async with sessions() as s, s.begin():
            _, secret = await auth.issue_token(s, "run", {"submit"})
        assert await checker.principal(secret) is not None
        assert await checker.principal(secret) is not None  # a hit within the TTL
        now[0] += 2.0
    assert len(checker._cache) == 1
