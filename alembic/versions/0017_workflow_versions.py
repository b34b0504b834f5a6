"""mixed-version fleets: runs waiting for a scheduler that has their version (advance_due),
the versions each scheduler loaded, the fingerprints of known workflow versions

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25 16:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sasflow.store.sqltime import now

revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable and without a default: added in place on both databases (no table copy).
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('advance_due', sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        'ix_runs_advance_due',
        'runs',
        ['advance_due'],
        unique=False,
        postgresql_where=sa.text('advance_due IS NOT NULL'),
        sqlite_where=sa.text('advance_due IS NOT NULL'),
    )
    json = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), 'postgresql'
    )
    with op.batch_alter_table('schedulers') as batch:
        batch.add_column(sa.Column('workflows', json, nullable=True))
    op.create_table(
        'workflow_versions',
        sa.Column('workflow', sa.String(length=100), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('fingerprint', sa.String(length=64), nullable=False),
        sa.Column('registered_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.Column('registered_by', sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint('workflow', 'version', name=op.f('pk_workflow_versions')),
    )


def downgrade() -> None:
    op.drop_table('workflow_versions')
    with op.batch_alter_table('schedulers') as batch:
        batch.drop_column('workflows')
    op.drop_index('ix_runs_advance_due', table_name='runs')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('advance_due')
