"""Migration 0006 adds request_contents and removes it again on downgrade, leaving the
requests stored before it alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command

from db.engine import alembic_config


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN "
                                         "('table', 'index')")}


def test_upgrade_adds_request_contents_and_downgrade_removes_it(tmp_path: Path) -> None:
    path = tmp_path / "agentd.db"
    cfg = alembic_config(f"sqlite+aiosqlite:///{path}")
    command.upgrade(cfg, "0005")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO sessions (id, tenant, priority, slo_class, state, created_at,"
                   " updated_at) VALUES ('s1', 'a', 0, 'default', '{}', 0, 0)")
        db.execute("INSERT INTO programs (id, session_id, status, context_tokens, steps, "
                   "pinned, status_reason, created_at, status_since) VALUES "
                   "('p1', 's1', 'STOPPED', 0, 1, 0, '', 0, 0)")
        db.execute("INSERT INTO requests (id, program_id, session_id, kind, model, status, "
                   "priority, max_tokens, prompt_tokens, cached_tokens, output_tokens, "
                   "failovers, queued_at) VALUES ('r1', 'p1', 's1', 'chat', 'm', "
                   "'finished', 0, 4, 3, 0, 4, 0, 0)")
    assert "request_contents" not in _tables(path)
    command.upgrade(cfg, "0006")
    assert {"request_contents", "ix_request_contents_session"} <= _tables(path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO request_contents (request_id, session_id, program_id, prompt,"
                   " completion, tool_calls, truncated, redactions, created_at) VALUES "
                   "('r1', 's1', 'p1', '{\"prompt\": \"hi\"}', 'yo', '[]', 0, 0, 1)")
    command.downgrade(cfg, "0005")
    assert not {"request_contents", "ix_request_contents_session"} & _tables(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT id, prompt_tokens FROM requests").fetchall() == [("r1", 3)]
    command.upgrade(cfg, "head")
    assert "request_contents" in _tables(path)
