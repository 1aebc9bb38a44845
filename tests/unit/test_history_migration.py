"""Migration 0005 adds the history's tables (history_points, events) and removes them
again on downgrade, leaving what was stored before it alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command

from db.engine import alembic_config


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN "
                                         "('table', 'index')")}


def test_upgrade_adds_the_history_tables_and_downgrade_removes_them(tmp_path: Path) -> None:
    path = tmp_path / "agentd.db"
    cfg = alembic_config(f"sqlite+aiosqlite:///{path}")
    command.upgrade(cfg, "0004")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO policies (name, layer, active_version, created_at) "
                   "VALUES ('mine', 'ordering', 1, 0)")
    assert not {"history_points", "events"} & _tables(path)
    command.upgrade(cfg, "0005")
    assert {"history_points", "events", "ix_history_step_ts", "ix_events_ts",
            "ix_events_kind_ts"} <= _tables(path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO history_points (series, label, step_s, ts, value, samples) "
                   "VALUES ('queue_length', '', 0, 1.0, 2.0, 1)")
        db.execute("INSERT INTO events (ts, last_ts, kind, severity, tenant, worker_id, "
                   "count, message, data) VALUES (1, 1, 'worker.crash', 'error', NULL, "
                   "'w0', 1, 'x', '{}')")
    command.downgrade(cfg, "0004")
    assert not {"history_points", "events", "ix_events_ts"} & _tables(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM policies").fetchall() == [("mine",)]
    command.upgrade(cfg, "head")  # and up again
    assert {"history_points", "events"} <= _tables(path)
