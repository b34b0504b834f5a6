"""timer steps: sleeping timers leave the claim's index (ix_steps_ready) for their own
(ix_steps_timers), so a million of them cost the claim nothing

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-25 17:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0018'
down_revision: str | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = "state = 'pending'"
_PENDING_NOT_TIMER = "state = 'pending' AND agent <> 'sasflow.timer'"
_PENDING_TIMER = "state = 'pending' AND agent = 'sasflow.timer'"


def _ready(predicate: str) -> None:
    op.create_index(
        'ix_steps_ready',
        'steps',
        [sa.literal_column('priority DESC'), 'not_before', 'id'],
        unique=False,
        postgresql_where=sa.text(predicate),
        sqlite_where=sa.text(predicate),
    )


def upgrade() -> None:
    op.drop_index('ix_steps_ready', table_name='steps')
    _ready(_PENDING_NOT_TIMER)
    op.create_index(
        'ix_steps_timers',
        'steps',
        ['not_before', 'id'],
        unique=False,
        postgresql_where=sa.text(_PENDING_TIMER),
        sqlite_where=sa.text(_PENDING_TIMER),
    )


def downgrade() -> None:
    op.drop_index('ix_steps_timers', table_name='steps')
    op.drop_index('ix_steps_ready', table_name='steps')
    _ready(_PENDING)
