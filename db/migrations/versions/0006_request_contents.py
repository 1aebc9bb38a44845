"""request_contents: prompts, completions and tool arguments of tenants that trace content

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28 13:05:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'request_contents',
        sa.Column('request_id', sa.String(length=128), nullable=False),
        sa.Column('session_id', sa.String(length=128), nullable=False),
        sa.Column('program_id', sa.String(length=128), nullable=False),
        sa.Column('prompt', sa.JSON(), nullable=False),
        sa.Column('completion', sa.Text(), nullable=False),
        sa.Column('tool_calls', sa.JSON(), nullable=False),
        sa.Column('truncated', sa.Boolean(), nullable=False),
        sa.Column('redactions', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['request_id'], ['requests.id']),
        sa.PrimaryKeyConstraint('request_id'),
    )
    op.create_index('ix_request_contents_session', 'request_contents', ['session_id'])


def downgrade() -> None:
    op.drop_index('ix_request_contents_session', table_name='request_contents')
    op.drop_table('request_contents')
