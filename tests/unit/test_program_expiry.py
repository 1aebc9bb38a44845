"""Programs that end when idle (`program_idle_timeout_s`): the pure clock
(scheduling/kv/idle.py) and the daemon's side on a real core with an injected clock
(daemon/core/expiry.py), so nothing here sleeps through a timeout."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from daemon.config import Config, ConfigError, load
from daemon.core.core import Core
from daemon.core.tenants import open_program
from daemon.state import ProgramState, ProgramStatus
from daemon.workers import protocol
from db import models
from scheduling.kv.idle import IdleClock, Quiet, tenant_timeouts
from tests.store_fixtures import Store

T0 = 1_000_000.0
SAMPLING = protocol.SamplingParams(max_tokens=4)


# --- the clock ----------------------------------------------------------------------


def test_due_takes_out_only_the_programs_past_their_own_timeout() -> None:
    clock = IdleClock()
    clock.touch(Quiet("a", "t", T0, 100.0))
    clock.touch(Quiet("b", "t", T0 + 10, 100.0))
    clock.touch(Quiet("c", "u", T0 + 20, 30.0))  # a shorter timeout, touched later
    assert clock.due(T0 + 49) == []
    assert [q.program_id for q in clock.due(T0 + 50)] == ["c"]
    assert [q.program_id for q in clock.due(T0 + 110)] == ["a", "b"]
    assert len(clock) == 0


def test_a_touch_moves_a_program_back_and_a_zero_timeout_stops_tracking() -> None:
    clock = IdleClock()
    clock.touch(Quiet("a", "t", T0, 100.0))
    clock.touch(Quiet("b", "t", T0 + 1, 100.0))
    clock.touch(Quiet("a", "t", T0 + 50, 100.0))  # a sign of life
    assert [q.program_id for q in clock.due(T0 + 101)] == ["b"]
    clock.touch(Quiet("a", "t", T0 + 60, 0.0))  # off for it
    assert "a" not in clock and clock.due(T0 + 10_000) == []


def test_due_stops_at_the_first_program_not_due() -> None:
    clock = IdleClock()
    for i in range(1000):
        clock.touch(Quiet(f"p{i}", "t", T0 + i, 60.0))
    assert [q.program_id for q in clock.due(T0 + 61.5)] == ["p0", "p1"]
    assert len(clock) == 998


def test_quiet_for_filters_by_idle_time_and_tenant() -> None:
    clock = IdleClock()
    clock.touch(Quiet("a", "t", T0, 1800.0))
    clock.touch(Quiet("b", "u", T0 + 5, 1800.0))
    clock.touch(Quiet("c", "t", T0 + 100, 60.0))
    assert [q.program_id for q in clock.quiet_for(T0 + 100, 50.0)] == ["a", "b"]
    assert [q.program_id for q in clock.quiet_for(T0 + 100, 50.0, "u")] == ["b"]
    assert len(clock) == 3  # listing takes nothing out


# --- configuration ------------------------------------------------------------------


def test_the_timeout_is_a_config_key_with_a_default_and_an_off_value() -> None:
    assert Config().program_idle_timeout_s == 1800.0
    assert load({"program_idle_timeout_s": 0}, env={}).program_idle_timeout_s == 0.0


@pytest.mark.parametrize("value", [-1, "soon"])
def test_a_bad_timeout_is_one_config_error_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match="program_idle_timeout_s"):
        load({"program_idle_timeout_s": value}, env={})


def test_a_tenant_table_sets_its_own_timeout(tmp_path: Path) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text("[slo.tenants.batch]\nweight = 2\nprogram_idle_timeout_s = 60\n")
    cfg = load(config_file=str(path), env={})
    assert tenant_timeouts(cfg.slo["tenants"]) == {"batch": 60.0}
    path.write_text("[slo.tenants.batch]\nprogram_idle_timeout_s = -5\n")
    with pytest.raises(ConfigError, match=r"slo\.tenants\.batch\.program_idle_timeout_s"):
        load(config_file=str(path), env={})
    path.write_text("[slo.tenants.batch]\nprogram_idle_timeout_s = true\n")
    with pytest.raises(ConfigError, match=r"slo\.tenants\.batch\.program_idle_timeout_s"):
        load(config_file=str(path), env={})


# --- the daemon's side --------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def core(tmp_path: Path, store_with_writer: Store) -> AsyncIterator[Core]:
    writer, sessions = store_with_writer
    config = Config(data_dir=str(tmp_path), config_dir=str(tmp_path / "config"),
                    heartbeat_timeout_s=600.0, program_idle_timeout_s=100.0,
                    slo={"tenants": {"quick": {"program_idle_timeout_s": 10},
                                     "forever": {"program_idle_timeout_s": 0}}})
    core = Core(config, writer, sessions)
    core.expiry.clock = Clock()
    await core.start()
    yield core
    await core.stop()


def advance(core: Core, seconds: float) -> None:
    clock = core.expiry.clock
    assert isinstance(clock, Clock)
    clock.now += seconds
    core.expiry.tick()


async def step(core: Core, program_id: str, tenant: str = "t") -> ProgramState:
    """A request of the program, queued and then aborted: one sign of life."""
    program = await open_program(core, program_id, None, tenant)
    req = core.submit(program, "chat", "m", SAMPLING,
                      messages=[protocol.ChatMessage(role="user", content="hi")])
    await core.abort(req.id)
    return program


def status(program: ProgramState) -> ProgramStatus:
    """Read through a call, so mypy does not narrow the status for good after one check."""
    return program.status


async def events(core: Core, kind: str, program_id: str) -> list[dict[str, Any]]:
    await core.writer.flush()
    async with core.sessions() as s:
        rows = await s.scalars(select(models.TraceEvent).where(
            models.TraceEvent.kind == kind, models.TraceEvent.program_id == program_id))
        return [dict(r.data) for r in rows]


async def reason_of(core: Core, program_id: str) -> str:
    await core.writer.flush()
    async with core.sessions() as s:
        row = await s.get(models.Program, program_id)
        assert row is not None
        return str(row.status_reason)


async def test_an_idle_program_ends_after_its_timeout_and_says_why(core: Core) -> None:
    program = await step(core, "idle-1")
    advance(core, 99)
    assert status(program) == ProgramStatus.ACTING
    advance(core, 2)
    assert status(program) == ProgramStatus.STOPPED
    [expired] = await events(core, "program.expired", "idle-1")
    assert expired["setting"] == "program_idle_timeout_s" and expired["timeout_s"] == 100
    assert expired["idle_s"] == pytest.approx(101)
    assert await reason_of(core, "idle-1") == \
        "idle for 101 s (program_idle_timeout_s = 100)"
    assert "idle-1" not in core.expiry.idle


async def test_a_request_restarts_the_clock_and_a_queued_one_holds_it(core: Core) -> None:
    program = await step(core, "busy-1")
    advance(core, 60)
    await step(core, "busy-1")
    advance(core, 60)  # 120 s since the first request, 60 since the last
    assert status(program) == ProgramStatus.ACTING
    queued = core.submit(program, "chat", "m", SAMPLING,
                         messages=[protocol.ChatMessage(role="user", content="hi")])
    advance(core, 500)  # no worker: the request waits in the queue, the program is busy
    assert status(program) != ProgramStatus.STOPPED
    await core.abort(queued.id)
    advance(core, 99)
    assert status(program) == ProgramStatus.ACTING
    advance(core, 2)
    assert status(program) == ProgramStatus.STOPPED


async def test_a_running_tool_holds_the_program_and_its_end_restarts_the_clock(
        core: Core) -> None:
    program = await step(core, "tool-1")
    core.kv.tool_started("tool-1", T0 + 1)
    advance(core, 300)
    assert status(program) == ProgramStatus.ACTING
    core.kv.tool_ended("tool-1", T0 + 350)
    advance(core, 149)  # at T0 + 449: 99 s after the tool ended
    assert status(program) == ProgramStatus.ACTING
    advance(core, 2)
    assert status(program) == ProgramStatus.STOPPED


async def test_a_tenant_timeout_overrides_the_default_and_zero_never_expires(
        core: Core) -> None:
    quick = await step(core, "quick-1", tenant="quick")
    forever = await step(core, "forever-1", tenant="forever")
    default = await step(core, "default-1", tenant="t")
    advance(core, 11)
    assert (quick.status, default.status) == (ProgramStatus.STOPPED, ProgramStatus.ACTING)
    [expired] = await events(core, "program.expired", "quick-1")
    assert expired["setting"] == "slo.tenants.quick.program_idle_timeout_s"
    advance(core, 100_000)
    assert (forever.status, default.status) == (ProgramStatus.ACTING, ProgramStatus.STOPPED)


async def test_an_owner_that_ends_its_programs_keeps_them(core: Core) -> None:
    program = await step(core, "run-prog.agent.0")
    core.expiry.keep.append(lambda pid: pid.startswith("run-prog"))
    advance(core, 1000)
    assert status(program) == ProgramStatus.ACTING


async def test_bulk_release_ends_the_quiet_ones_of_a_tenant(core: Core) -> None:
    old = await step(core, "bulk-old", tenant="t")
    other = await step(core, "bulk-other", tenant="u")
    advance(core, 50)
    fresh = await step(core, "bulk-fresh", tenant="t")
    listed = await core.expiry.release_idle(30, "t", "op", dry_run=True)
    assert [q.program_id for q in listed] == ["bulk-old"]
    assert status(old) == ProgramStatus.ACTING
    ended = await core.expiry.release_idle(30, "t", "op")
    assert [q.program_id for q in ended] == ["bulk-old"]
    assert (old.status, other.status, fresh.status) == (
        ProgramStatus.STOPPED, ProgramStatus.ACTING, ProgramStatus.ACTING)
    [expired] = await events(core, "program.expired", "bulk-old")
    assert expired["by"] == "op"
    assert await reason_of(core, "bulk-old") == "idle for 50 s (released as idle by op)"


async def test_a_live_program_left_in_the_store_by_a_restart_expires_too(core: Core) -> None:
    core.writer.insert("sessions", {
        "id": "s-left", "tenant": "t", "priority": 0, "slo_class": "default",
        "pinned_worker": None, "state": {}, "created_at": T0, "updated_at": T0})
    core.writer.insert("programs", {
        "id": "p-left", "session_id": "s-left", "status": "ACTING", "worker_id": None,
        "context_tokens": 0, "steps": 1, "pinned": False, "status_reason": "request ended",
        "created_at": T0 - 50, "status_since": T0 - 50, "stopped_at": None})
    await core.writer.flush()
    await core.expiry.load_stored()
    assert "p-left" in core.expiry.idle and "p-left" not in core.programs
    advance(core, 49)
    await core.expiry.settled()
    assert "p-left" not in core.programs
    advance(core, 2)
    await core.expiry.settled()
    assert core.programs["p-left"].status == ProgramStatus.STOPPED
    assert await reason_of(core, "p-left") == "idle for 101 s (program_idle_timeout_s = 100)"
