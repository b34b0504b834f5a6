"""subscription stream: subscribers and their unacknowledged updates

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# `now()` on PostgreSQL; the strftime() form on SQLite (see sasflow.store.sqltime).
from sasflow.store.sqltime import now

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql')
_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('subscribers',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('workflows', _JSON, nullable=True),
    sa.Column('submitted_by', sa.String(length=200), nullable=True),
    sa.Column('stream_id', sa.String(length=36), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('connected_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_subscribers')),
    sa.UniqueConstraint('stream_id', name=op.f('uq_subscribers_stream_id'))
    )
    op.create_table('stream_updates',
    sa.Column('id', _ID, sa.Identity(always=False), nullable=False),
    sa.Column('subscriber_id', sa.String(length=36), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=True),
    sa.Column('run_id', _ID, nullable=True),
    sa.Column('body', _JSON, nullable=False),
    sa.Column('sent_stream', sa.String(length=36), nullable=True),
    sa.Column('sent_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['subscriber_id'], ['subscribers.id'], name=op.f('fk_stream_updates_subscriber_id_subscribers'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_stream_updates')),
    sa.UniqueConstraint('uuid', name=op.f('uq_stream_updates_uuid'))
    )
    op.create_index('ix_stream_updates_subscriber_id_id', 'stream_updates', ['subscriber_id', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_stream_updates_subscriber_id_id', table_name='stream_updates')
    op.drop_table('stream_updates')
    op.drop_table('subscribers')
