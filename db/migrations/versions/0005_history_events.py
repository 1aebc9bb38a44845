"""history_events: the daemon's own sampled series and its operator event log

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28 12:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'history_points',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('series', sa.String(length=64), nullable=False),
        sa.Column('label', sa.String(length=128), nullable=False),
        sa.Column('step_s', sa.Integer(), nullable=False),
        sa.Column('ts', sa.Float(), nullable=False),
        sa.Column('value', sa.Float(), nullable=False),
        sa.Column('samples', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_history_step_ts', 'history_points', ['step_s', 'ts'])
    op.create_table(
        'events',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('ts', sa.Float(), nullable=False),
        sa.Column('last_ts', sa.Float(), nullable=False),
        sa.Column('kind', sa.String(length=64), nullable=False),
        sa.Column('severity', sa.String(length=16), nullable=False),
        sa.Column('tenant', sa.String(length=128), nullable=True),
        sa.Column('worker_id', sa.String(length=128), nullable=True),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.Column('message', sa.Text(), nullable=False),
        sa.Column('data', sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_events_ts', 'events', ['ts'])
    op.create_index('ix_events_kind_ts', 'events', ['kind', 'ts'])


def downgrade() -> None:
    op.drop_index('ix_events_kind_ts', table_name='events')
    op.drop_index('ix_events_ts', table_name='events')
    op.drop_table('events')
    op.drop_index('ix_history_step_ts', table_name='history_points')
    op.drop_table('history_points')
