"""agent instances say how many worker threads handlers hold past their deadline (wedged)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25 16:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds it without rewriting the table, SQLite in place.
    with op.batch_alter_table('agent_instances') as batch:
        batch.add_column(sa.Column('held', sa.Integer(), server_default=sa.text('0'), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('agent_instances') as batch:
        batch.drop_column('held')
