"""supervisor: leases, alert delivery, run failure policy

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 03:32:40.502393
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# `now()` on PostgreSQL, the same DDL as before; SQLite's DEFAULT takes no now(), so there it
# is the strftime() form of SQLAlchemy's DateTime text (see sasflow.store.sqltime).
from sasflow.store.sqltime import now


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('leases',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('holder', sa.String(length=100), nullable=False),
    sa.Column('token', sa.BigInteger(), nullable=False),
    sa.Column('acquired_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_leases'))
    )
    op.add_column('alerts', sa.Column('acknowledge_reason', sa.Text(), nullable=True))
    op.add_column('alerts', sa.Column('notified_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_alerts_unnotified', 'alerts', ['id'], unique=False, postgresql_where=sa.text('notified_at IS NULL'), sqlite_where=sa.text('notified_at IS NULL'))
    op.add_column('runs', sa.Column('on_failure', sa.String(length=20), server_default=sa.text("'error'"), nullable=False))


def downgrade() -> None:
    op.drop_column('runs', 'on_failure')
    op.drop_index('ix_alerts_unnotified', table_name='alerts', postgresql_where=sa.text('notified_at IS NULL'), sqlite_where=sa.text('notified_at IS NULL'))
    op.drop_column('alerts', 'notified_at')
    op.drop_column('alerts', 'acknowledge_reason')
    op.drop_table('leases')
