"""retention and dead letters: audit table, finished runs by age, alerts by run

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# `now()` on PostgreSQL; the strftime() form on SQLite (see sasflow.store.sqltime).
from sasflow.store.sqltime import now

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('audit',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), sa.Identity(always=False), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('action', sa.String(length=50), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('detail', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit'))
    )
    op.create_index('ix_runs_finished_at', 'runs', ['finished_at'], unique=False, postgresql_where=sa.text('finished_at IS NOT NULL'), sqlite_where=sa.text('finished_at IS NOT NULL'))
    op.create_index('ix_alerts_run_id', 'alerts', ['run_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_alerts_run_id', table_name='alerts')
    op.drop_index('ix_runs_finished_at', table_name='runs', postgresql_where=sa.text('finished_at IS NOT NULL'), sqlite_where=sa.text('finished_at IS NOT NULL'))
    op.drop_table('audit')
