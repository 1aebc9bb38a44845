"""Bounded session caches: the core's record of the sessions it stored and the tenants'
cache keep the most recent ones only, and a session they forgot that comes back is
neither inserted twice nor given another tenant (a real SQLite store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from daemon import lru
from daemon.config import Config
from daemon.core.core import Core
from daemon.core.tenants import open_program
from daemon.lru import Lru
from daemon.state import ProgramStatus
from db import models
from db import writer as writer_module
from tests.store_fixtures import Store

NOW = 1000.0


@pytest.fixture
def store(store_with_writer: Store) -> Store:
    return store_with_writer


def _session_row(sid: str, tenant: str = "default") -> dict[str, object]:
    return {"id": sid, "tenant": tenant, "priority": 0, "slo_class": "default",
            "pinned_worker": None, "state": {}, "created_at": NOW, "updated_at": NOW}


async def _rows(sessions: async_sessionmaker[AsyncSession]) -> dict[str, str]:
    async with sessions() as s:
        return {r.id: r.tenant for r in await s.scalars(select(models.Session))}


def test_lru_keeps_the_most_recently_used() -> None:
    cache: Lru[str, int] = Lru(2)
    assert cache.setdefault("a", 1) == 1 and cache.setdefault("b", 2) == 2
    assert cache.get("a") == 1  # a is now the most recent
    assert cache.setdefault("c", 3) == 3  # b goes
    assert "b" not in cache and cache.get("b") is None and len(cache) == 2
    assert cache.setdefault("a", 9) == 1  # kept, and made the most recent again
    cache.setdefault("d", 4)
    assert "c" not in cache and "a" in cache and "d" in cache
    with pytest.raises(ValueError, match="cap=0"):
        Lru(0)


@pytest.mark.parametrize("on_conflict", [True, False], ids=["on-conflict", "select-first"])
async def test_an_insert_if_absent_leaves_a_stored_row_and_its_updates_land(
        store: Store, monkeypatch: pytest.MonkeyPatch, on_conflict: bool) -> None:
    if not on_conflict:  # the path for a store whose dialect has no ON CONFLICT
        monkeypatch.setattr(writer_module, "_ON_CONFLICT", {})
    writer, sessions = store
    writer.insert("sessions", _session_row("s1", "gold"), if_absent=True)
    writer.insert("sessions", _session_row("s1", "free"), if_absent=True)  # same batch
    await writer.flush()
    writer.insert("sessions", _session_row("s1", "late"), if_absent=True)  # a later batch
    writer.insert("sessions", _session_row("s2", "acme"), if_absent=True)
    writer.update("sessions", "s1", priority=7)  # folded into nothing: runs after
    writer.update("sessions", "s2", tenant="acme2")
    await writer.flush()
    assert writer.last_error is None
    assert await _rows(sessions) == {"s1": "gold", "s2": "acme2"}
    async with sessions() as s:
        assert (await s.get(models.Session, "s1")).priority == 7  # type: ignore[union-attr]
    # a plain insert of a stored key still fails its batch, as before
    writer.insert("sessions", _session_row("s1"))
    await writer.flush()
    assert writer.last_error is not None and "IntegrityError" in writer.last_error


async def test_a_forgotten_session_comes_back_without_a_second_row_or_another_tenant(
        tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lru, "SESSIONS_REMEMBERED", 2)
    writer, sessions = store
    core = Core(Config(data_dir=str(tmp_path)), writer, sessions)
    first = await open_program(core, None, "s-a", "gold")
    await writer.flush()
    for sid in ("s-b", "s-c", "s-d"):  # push s-a out of both caches
        await open_program(core, None, sid, "free")
    await writer.flush()
    assert "s-a" not in core._known_sessions and "s-a" not in core.slo.tenants._known
    assert len(core._known_sessions) == len(core.slo.tenants._known) == 2
    again = await open_program(core, None, "s-a", "free")
    # forgotten again before the writer flushes, most likely: in one batch or not,
    # the outcome is the same
    for sid in ("s-e", "s-f"):
        await open_program(core, None, sid, "free")
    third = await open_program(core, None, "s-a", "acme")
    await writer.flush()
    assert writer.last_error is None
    rows = await _rows(sessions)
    assert rows == {"s-a": "gold", **{f"s-{c}": "free" for c in "bcdef"}}
    async with sessions() as s:
        programs = (await s.scalars(select(models.Program.id)
                                    .where(models.Program.session_id == "s-a"))).all()
    assert sorted(programs) == sorted([first.id, again.id, third.id])
    assert await core.slo.tenants.of("s-a") == "gold"  # read back from the store
    # a caller of another tenant runs as itself in the session (daemon/core/tenants.py)
    assert core.slo.tagging.tenants[again.id] == "free"


async def test_load_known_sessions_reads_only_live_programs_sessions(
        tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lru, "SESSIONS_REMEMBERED", 3)
    writer, sessions = store
    statuses = [ProgramStatus.STOPPED, ProgramStatus.FAILED, ProgramStatus.QUEUED,
                ProgramStatus.PAUSED, ProgramStatus.REASONING, ProgramStatus.ACTING]
    for n, status in enumerate(statuses):
        writer.insert("sessions", _session_row(f"s{n}"))
        for k in range(2):  # two programs of one session: one id
            writer.insert("programs", {
                "id": f"p{n}-{k}", "session_id": f"s{n}", "status": status.value,
                "worker_id": None, "context_tokens": 0, "steps": 0, "pinned": False,
                "status_reason": "", "created_at": NOW, "status_since": NOW,
                "stopped_at": None})
    await writer.flush()
    core = Core(Config(data_dir=str(tmp_path)), writer, sessions)
    await core.load_known_sessions()
    known = {f"s{n}" for n in range(len(statuses)) if f"s{n}" in core._known_sessions}
    assert len(known) == 3 and known <= {"s2", "s3", "s4", "s5"}
    # a session it did not load is still stored once when a program comes to it
    await open_program(core, None, "s0", "gold")
    await writer.flush()
    assert writer.last_error is None
    async with sessions() as s:
        assert await s.scalar(select(func.count()).select_from(models.Session)) == 6
        assert (await s.get(models.Session, "s0")).tenant == "default"  # type: ignore[union-attr]
