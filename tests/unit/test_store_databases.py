"""The store's schema on both databases it supports (SQLite, PostgreSQL): the migrations
build exactly what the models say, go down and up again, and the columns that grow past
32 bits take 64-bit values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.pool import NullPool

from db import models
from db.engine import alembic_config, make_engine, sync_url, upgrade, upgrade_sync
from db.writer import BatchWriter

BEYOND_32_BITS = 2**40
REPO = Path(__file__).resolve().parents[2]


def _schema_diff(url: str) -> list[object]:
    engine = create_engine(sync_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return list(compare_metadata(MigrationContext.configure(conn), models.Base.metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(sync_url(url), poolclass=NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_build_the_models_and_go_down_and_up(store_url: str) -> None:
    upgrade_sync(store_url)
    assert _schema_diff(store_url) == []
    command.downgrade(alembic_config(store_url), "base")
    assert _tables(store_url) <= {"alembic_version"}
    upgrade_sync(store_url)
    assert _schema_diff(store_url) == []


async def test_growing_keys_and_disk_bytes_take_64_bit_values(store_url: str) -> None:
    await upgrade(store_url)
    engine = make_engine(store_url)
    if engine.dialect.name == "postgresql":  # the key's sequence counts past 2^31 too
        async with engine.begin() as conn:
            await conn.execute(text(f"SELECT setval('trace_events_id_seq', {BEYOND_32_BITS})"))
    writer = BatchWriter(engine)
    writer.start()
    try:
        writer.trace("test.first", session_id="s")
        writer.trace("test.second", session_id="s")
        writer.insert("tool_containers", {
            "id": "c1", "program_id": "p", "tool": "t", "backend": "docker",
            "container_id": None, "state": "running", "disk_bytes": 5 * 2**30,
            "created_at": 1.0, "removed_at": None})
        writer.insert("events", {
            "id": BEYOND_32_BITS, "ts": 1.0, "last_ts": 1.0, "kind": "k",
            "severity": "info", "tenant": None, "worker_id": None, "count": 1,
            "message": "m", "data": {}})
        await writer.flush()
        assert writer.last_error is None
        async with engine.connect() as conn:
            ids = (await conn.execute(select(models.TraceEvent.id)
                                      .order_by(models.TraceEvent.id))).scalars().all()
            disk = await conn.scalar(select(models.ToolContainer.disk_bytes))
            top = await conn.scalar(select(func.max(models.OperatorEvent.id)))
        assert ids[1] == ids[0] + 1  # still assigned by the store, in order
        if engine.dialect.name == "postgresql":
            assert ids[0] > BEYOND_32_BITS
        assert disk == 5 * 2**30 and top == BEYOND_32_BITS
    finally:
        await writer.stop()
        await engine.dispose()


def test_two_processes_may_upgrade_one_postgresql_database_at_once(postgres_url: str) -> None:
    """Two daemons on one database (an active one and a standby) both upgrade as they
    start: on a fresh database the second waits for the first, then finds it at head."""
    code = "import sys; from db.engine import upgrade_sync; upgrade_sync(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, postgres_url], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert _schema_diff(postgres_url) == []
