"""Stored policy sources follow the scheduling package's new layout (migration 0004)."""

from __future__ import annotations

import importlib.util
import re
import sqlite3
from pathlib import Path

from alembic import command

from db.engine import alembic_config

OLD_SOURCE = """\
from scheduling.ordering import OrderingPolicy
import scheduling.control_rules as rules
from scheduling.layer_policies import AdmissionPolicy
from scheduling.kv import KvPolicy  # unchanged
# scheduling.orderingX is not a module name and stays
"""


def _store(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "agentd.db"
    return f"sqlite+aiosqlite:///{path}", path


def test_stored_sources_import_the_new_module_names_and_downgrade_restores(
        tmp_path: Path) -> None:
    url, path = _store(tmp_path)
    cfg = alembic_config(url)
    command.upgrade(cfg, "0003")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO policies (name, layer, active_version, created_at) "
                   "VALUES ('mine', 'ordering', 1, 0)")
        db.execute("INSERT INTO policy_versions (policy_name, version, source, author, status, "
                   "validation_report, created_at) VALUES ('mine', 1, ?, '', 'active', '{}', 0)",
                   (OLD_SOURCE,))
    command.upgrade(cfg, "head")
    with sqlite3.connect(path) as db:
        (source,) = db.execute("SELECT source FROM policy_versions").fetchone()
    assert "from scheduling.slo.ordering import OrderingPolicy" in source
    assert "import scheduling.agents.rules as rules" in source
    assert "from scheduling.layers import AdmissionPolicy" in source
    assert "from scheduling.kv import KvPolicy" in source
    assert "scheduling.orderingX" in source
    for name in re.findall(r"(?:from|import) (scheduling[\w.]*)", source):
        assert importlib.util.find_spec(name) is not None, name
    command.downgrade(cfg, "0003")
    with sqlite3.connect(path) as db:
        (source,) = db.execute("SELECT source FROM policy_versions").fetchone()
    assert source == OLD_SOURCE
