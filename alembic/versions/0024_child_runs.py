"""child workflows: a run started by a child step (Step.child) names its parent run and step

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-25 22:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0024'
down_revision: str | None = '0023'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_CHILD = 'parent_run_id IS NOT NULL'


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('parent_run_id', _ID, nullable=True))
        batch.add_column(sa.Column('parent_step', sa.String(100), nullable=True))
    op.create_index(
        'ix_runs_parent_run_id',
        'runs',
        ['parent_run_id'],
        postgresql_where=sa.text(_CHILD),
        sqlite_where=sa.text(_CHILD),
    )


def downgrade() -> None:
    op.drop_index('ix_runs_parent_run_id', table_name='runs')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('parent_step')
        batch.drop_column('parent_run_id')
