"""Stored policy sources follow the scheduling package's new layout (migration 0004)."""

from __future__ import annotations

import importlib.util
import re

from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from db.engine import alembic_config, sync_url

OLD_SOURCE = """\
from scheduling.ordering import OrderingPolicy
import scheduling.control_rules as rules
from scheduling.layer_policies import AdmissionPolicy
from scheduling.kv import KvPolicy  # unchanged
# scheduling.orderingX is not a module name and stays
"""


def _source(url: str) -> str:
    engine = create_engine(sync_url(url), poolclass=NullPool)
    with engine.connect() as db:
        source = db.execute(text("SELECT source FROM policy_versions")).scalar_one()
    engine.dispose()
    return str(source)


def test_stored_sources_import_the_new_module_names_and_downgrade_restores(
        store_url: str) -> None:
    """On SQLite and on PostgreSQL: the migration rewrites rows, not only the schema."""
    url = store_url
    cfg = alembic_config(url)
    command.upgrade(cfg, "0003")
    engine = create_engine(sync_url(url), poolclass=NullPool)
    with engine.begin() as db:
        db.execute(text("INSERT INTO policies (name, layer, active_version, created_at) "
                        "VALUES ('mine', 'ordering', 1, 0)"))
        db.execute(text("INSERT INTO policy_versions (policy_name, version, source, author,"
                        " status, validation_report, created_at) VALUES ('mine', 1, :source,"
                        " '', 'active', '{}', 0)"), {"source": OLD_SOURCE})
    engine.dispose()
    command.upgrade(cfg, "head")
    source = _source(url)
    assert "from scheduling.slo.ordering import OrderingPolicy" in source
    assert "import scheduling.agents.rules as rules" in source
    assert "from scheduling.layers import AdmissionPolicy" in source
    assert "from scheduling.kv import KvPolicy" in source
    assert "scheduling.orderingX" in source
    for name in re.findall(r"(?:from|import) (scheduling[\w.]*)", source):
        assert importlib.util.find_spec(name) is not None, name
    command.downgrade(cfg, "0003")
    assert _source(url) == OLD_SOURCE
