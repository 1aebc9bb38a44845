"""responses: stored Responses API responses and the conversations they continue

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-08 00:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'responses',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('tenant', sa.String(length=128), nullable=False),
        sa.Column('session_id', sa.String(length=128), nullable=False),
        sa.Column('program_id', sa.String(length=128), nullable=False),
        sa.Column('previous_response_id', sa.String(length=64), nullable=True),
        sa.Column('model', sa.String(length=256), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('conversation', sa.JSON(), nullable=False),
        sa.Column('body', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )


def downgrade() -> None:
    op.drop_table('responses')
