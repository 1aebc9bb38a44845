"""api_tokens.tenant: the tenant a token's requests run as

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 00:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no backfill: a NULL tenant reads as the token's id, which is what the
    # rate limiter keyed existing tokens by.
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tenant', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_column('tenant')
