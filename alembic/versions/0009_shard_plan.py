"""shard plan: the scope strategy's plan epochs and ranges, each scheduler's assignment strategy

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 15:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# `now()` on PostgreSQL; the strftime() form on SQLite (see sasflow.store.sqltime).
from sasflow.store.sqltime import now

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    with op.batch_alter_table('schedulers') as batch:
        batch.add_column(sa.Column('assignment', sa.String(length=20), server_default=sa.text("'acquire'"), nullable=False))
    op.create_table('shard_plan',
    sa.Column('name', sa.String(length=20), nullable=False),
    sa.Column('epoch', sa.BigInteger(), nullable=False),
    sa.Column('ready', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('leader', sa.String(length=100), nullable=False),
    sa.Column('leader_name', sa.String(length=100), nullable=False),
    sa.Column('token', sa.BigInteger(), nullable=False),
    sa.Column('active', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('live', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_shard_plan'))
    )
    op.create_table('shard_ranges',
    sa.Column('epoch', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('scheduler_id', sa.String(length=100), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('address', sa.String(length=255), nullable=False),
    sa.Column('first', sa.Integer(), nullable=False),
    sa.Column('last', sa.Integer(), nullable=False),
    sa.Column('lo_id', _ID, nullable=True),
    sa.Column('hi_id', _ID, nullable=True),
    sa.PrimaryKeyConstraint('epoch', 'name', name=op.f('pk_shard_ranges'))
    )


def downgrade() -> None:
    op.drop_table('shard_ranges')
    op.drop_table('shard_plan')
    with op.batch_alter_table('schedulers') as batch:
        batch.drop_column('assignment')
