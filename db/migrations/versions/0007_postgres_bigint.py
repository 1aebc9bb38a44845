"""postgres_bigint: 64-bit keys for the tables that grow without bound, and for disk bytes

On PostgreSQL the autoincrement keys of trace_events, history_points and events were
SERIAL (32-bit, with a 32-bit sequence): a long-lived daemon would stop tracing at 2^31
rows. tool_containers.disk_bytes was a 32-bit integer there too, and a container's disk
passes 2 GiB. SQLite's INTEGER is 64-bit already: nothing changes on it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28 16:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

GROWING = ('trace_events', 'history_points', 'events')


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    for table in GROWING:
        op.alter_column(table, 'id', type_=sa.BigInteger(), existing_nullable=False)
        op.execute(f'ALTER SEQUENCE {table}_id_seq AS BIGINT')
    op.alter_column('tool_containers', 'disk_bytes', type_=sa.BigInteger(),
                    existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.alter_column('tool_containers', 'disk_bytes', type_=sa.Integer(),
                    existing_nullable=False)
    for table in GROWING:
        op.execute(f'ALTER SEQUENCE {table}_id_seq AS INTEGER')
        op.alter_column(table, 'id', type_=sa.Integer(), existing_nullable=False)
