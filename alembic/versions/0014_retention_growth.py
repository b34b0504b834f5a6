"""retention of what grows: when a subscriber's stream was last open and when it expired,
audit rows by age, when the retention next looks at the dead letters' head

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 13:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable and without a default, so SQLite adds it in place (no table copy): NULL reads
    # as "not seen since it connected" (connected_at).
    with op.batch_alter_table('subscribers') as batch:
        batch.add_column(sa.Column('seen_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_audit_created_at', 'audit', ['created_at'], unique=False)
    op.create_table('retention_marks',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('due_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_retention_marks'))
    )


def downgrade() -> None:
    op.drop_table('retention_marks')
    op.drop_index('ix_audit_created_at', table_name='audit')
    with op.batch_alter_table('subscribers') as batch:
        batch.drop_column('expired_at')
        batch.drop_column('seen_at')
