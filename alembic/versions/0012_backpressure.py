"""backpressure: the backlog index of runs, and alerts by subject and time

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Partial: only runs waiting to start (a workflow's backlog), so it stays small.
    op.create_index(
        'ix_runs_backlog',
        'runs',
        ['workflow', 'created_at'],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        'ix_alerts_dedup_key_created_at', 'alerts', ['dedup_key', 'created_at'], unique=False
    )


def downgrade() -> None:
    op.drop_index('ix_alerts_dedup_key_created_at', table_name='alerts')
    op.drop_index(
        'ix_runs_backlog',
        table_name='runs',
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
