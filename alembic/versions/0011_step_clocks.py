"""flow control: the three clocks of a step (wait, execution, heartbeat) and run deadlines

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DEADLINE_DUE = (
    "deadline_at IS NOT NULL AND deadline_fired_at IS NULL AND state IN ('pending', 'running')"
)


def upgrade() -> None:
    # Steps already claimed keep their `complete_by`; with `started_at` NULL the supervisor
    # treats them as unstarted: uncharged once that deadline passes (docs/timeouts.md).
    with op.batch_alter_table('steps') as batch:
        batch.add_column(sa.Column('started_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column('wait_expiries', sa.Integer(), server_default=sa.text('0'), nullable=False)
        )
        batch.add_column(
            sa.Column('wait_timeout_s', sa.Float(), server_default=sa.text('30'), nullable=False)
        )
        batch.add_column(sa.Column('heartbeat_timeout_s', sa.Float(), nullable=True))
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('deadline_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('on_deadline', sa.String(length=20), nullable=True))
        batch.add_column(
            sa.Column('deadline_fired_at', sa.DateTime(timezone=True), nullable=True)
        )
    op.create_index(
        'ix_runs_deadline_due',
        'runs',
        ['deadline_at'],
        unique=False,
        postgresql_where=sa.text(_DEADLINE_DUE),
        sqlite_where=sa.text(_DEADLINE_DUE),
    )


def downgrade() -> None:
    op.drop_index(
        'ix_runs_deadline_due',
        table_name='runs',
        postgresql_where=sa.text(_DEADLINE_DUE),
        sqlite_where=sa.text(_DEADLINE_DUE),
    )
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('deadline_fired_at')
        batch.drop_column('on_deadline')
        batch.drop_column('deadline_at')
    with op.batch_alter_table('steps') as batch:
        batch.drop_column('heartbeat_timeout_s')
        batch.drop_column('wait_timeout_s')
        batch.drop_column('wait_expiries')
        batch.drop_column('started_at')
