"""map items index: a map's items by state and index (ix_steps_map_items), so ending an item
counts and releases them without reading its run; a run's unpublished events
(ix_events_run_unpublished), so the relay finds a run's first one without walking its history

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-25 22:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0025'
down_revision: str | None = '0024'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        'ix_steps_map_items',
        'steps',
        ['map_parent', 'state', 'map_index'],
        postgresql_where=sa.text('map_parent IS NOT NULL'),
        sqlite_where=sa.text('map_parent IS NOT NULL'),
    )
    op.create_index(
        'ix_events_run_unpublished',
        'events',
        ['run_id', 'id'],
        postgresql_where=sa.text('NOT published'),
        sqlite_where=sa.text('NOT published'),
    )


def downgrade() -> None:
    op.drop_index('ix_events_run_unpublished', table_name='events')
    op.drop_index('ix_steps_map_items', table_name='steps')
