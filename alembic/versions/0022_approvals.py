"""approvals: when an open approval becomes overdue (`steps.escalate_at`), and its index

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-25 22:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0022'
down_revision: str | None = '0021'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ESCALATING = 'escalate_at IS NOT NULL'


def upgrade() -> None:
    with op.batch_alter_table('steps') as batch:
        batch.add_column(sa.Column('escalate_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        'ix_steps_escalations',
        'steps',
        ['escalate_at'],
        unique=False,
        postgresql_where=sa.text(_ESCALATING),
        sqlite_where=sa.text(_ESCALATING),
    )


def downgrade() -> None:
    op.drop_index('ix_steps_escalations', table_name='steps')
    with op.batch_alter_table('steps') as batch:
        batch.drop_column('escalate_at')
