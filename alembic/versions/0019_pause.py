"""pause and resume: a run's `paused` flag, paused agents and actions

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-25 17:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from sasflow.store.sqltime import now

revision: str = '0019'
down_revision: str | None = '0018'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds it without rewriting the table.
    with op.batch_alter_table('runs') as batch:
        batch.add_column(
            sa.Column('paused', sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    op.create_table(
        'agent_pauses',
        sa.Column('agent', sa.String(length=100), nullable=False),
        sa.Column('action', sa.String(length=100), nullable=False),
        sa.Column('paused_by', sa.String(length=200), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('paused_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.PrimaryKeyConstraint('agent', 'action', name=op.f('pk_agent_pauses')),
    )


def downgrade() -> None:
    op.drop_table('agent_pauses')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('paused')
