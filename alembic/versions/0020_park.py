"""parked steps: whether a step parks instead of failing, and the index of parked steps

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-25 19:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0020'
down_revision: str | None = '0019'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Constant defaults: PostgreSQL 11+ adds them without rewriting the table.
    with op.batch_alter_table('steps') as batch:
        batch.add_column(
            sa.Column('park_exhausted', sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.add_column(
            sa.Column('park_errors', sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    op.create_index(
        'ix_steps_parked',
        'steps',
        ['run_id'],
        unique=False,
        postgresql_where=sa.text("state = 'parked'"),
        sqlite_where=sa.text("state = 'parked'"),
    )


def downgrade() -> None:
    op.drop_index('ix_steps_parked', table_name='steps')
    with op.batch_alter_table('steps') as batch:
        batch.drop_column('park_errors')
        batch.drop_column('park_exhausted')
