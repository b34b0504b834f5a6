"""map steps: the items of a map step (Step.map) are step records naming their map's record,
their index and the map's size

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0023'
down_revision: str | None = '0022'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    with op.batch_alter_table('steps') as batch:
        batch.add_column(sa.Column('map_parent', _ID, nullable=True))
        batch.add_column(sa.Column('map_index', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('map_size', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('steps') as batch:
        batch.drop_column('map_size')
        batch.drop_column('map_index')
        batch.drop_column('map_parent')
