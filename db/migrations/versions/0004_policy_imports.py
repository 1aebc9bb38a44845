"""policy_imports: stored policy sources import the scheduling modules by their new names

The scheduling package was laid out by part (issue 22): `scheduling.ordering` became
`scheduling.slo.ordering`, `scheduling.control_rules` became `scheduling.agents.rules`, and
so on. Policy code may import only `scheduling.*`, so every stored version is rewritten to
the new names; otherwise an operator's policy would fail validation after an upgrade.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28 00:00:00
"""
import re

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

RENAMED = {
    "scheduling.control": "scheduling.agents.policy",
    "scheduling.control_cluster": "scheduling.agents.cluster",
    "scheduling.control_load": "scheduling.agents.load",
    "scheduling.control_local": "scheduling.agents.local",
    "scheduling.control_messages": "scheduling.agents.messages",
    "scheduling.control_resources": "scheduling.agents.resources",
    "scheduling.control_rules": "scheduling.agents.rules",
    "scheduling.control_waiting": "scheduling.agents.waiting",
    "scheduling.control_policies": "scheduling.agents.policies",
    "scheduling.admission": "scheduling.slo.admission",
    "scheduling.meta": "scheduling.slo.meta",
    "scheduling.meta_llm": "scheduling.slo.meta_llm",
    "scheduling.ordering": "scheduling.slo.ordering",
    "scheduling.prediction": "scheduling.slo.prediction",
    "scheduling.views": "scheduling.slo.views",
    "scheduling.slo_metrics": "scheduling.slo.metrics",
    "scheduling.slo_templates": "scheduling.slo.templates",
    "scheduling.layer_policies": "scheduling.layers",
}


def rewrite(source: str, names: dict[str, str]) -> str:
    """Every dotted name in `names` (as a whole name) replaced, longest first, in one pass."""
    alternation = "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w.])(" + alternation + r")(?![\w])")
    return pattern.sub(lambda m: names[m.group(1)], source)


def _apply(names: dict[str, str]) -> None:
    versions = sa.table('policy_versions', sa.column('id', sa.Integer),
                        sa.column('source', sa.Text))
    conn = op.get_bind()
    for row in conn.execute(sa.select(versions.c.id, versions.c.source)).all():
        new = rewrite(row.source, names)
        if new != row.source:
            conn.execute(versions.update().where(versions.c.id == row.id).values(source=new))


def upgrade() -> None:
    _apply(RENAMED)


def downgrade() -> None:
    _apply({new: old for old, new in RENAMED.items()})
