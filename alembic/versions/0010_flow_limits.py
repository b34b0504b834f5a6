"""flow limits: flow_limits, flow_buckets, ix_steps_ready_agent; what agent instances report of their actions and breakers

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# `now()` on PostgreSQL; the strftime() form on SQLite (see sasflow.store.sqltime).
from sasflow.store.sqltime import now

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    with op.batch_alter_table('agent_instances') as batch:
        batch.add_column(sa.Column('actions', _JSON, nullable=True))
        batch.add_column(sa.Column('breakers_open_for', _JSON, nullable=True))
    op.create_table('flow_limits',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('agent', sa.String(length=100), nullable=False),
    sa.Column('actions', _JSON, nullable=True),
    sa.Column('dependency', sa.String(length=100), nullable=True),
    sa.Column('key', sa.String(length=200), nullable=True),
    sa.Column('rate', sa.Float(), nullable=True),
    sa.Column('burst', sa.Integer(), nullable=True),
    sa.Column('concurrency', sa.Integer(), nullable=True),
    sa.Column('enabled', sa.Boolean(), server_default=sa.true(), nullable=False),
    sa.Column('last_admitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('updated_by', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_flow_limits'))
    )
    op.create_index('ix_flow_limits_agent', 'flow_limits', ['agent'], unique=False)
    op.create_index('ix_steps_ready_agent', 'steps', ['agent', sa.text('priority DESC'), 'not_before', 'id'], unique=False, postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))
    op.create_table('flow_buckets',
    sa.Column('limit_name', sa.String(length=100), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('tat', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['limit_name'], ['flow_limits.name'], name=op.f('fk_flow_buckets_limit_name_flow_limits'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('limit_name', 'key', name=op.f('pk_flow_buckets'))
    )


def downgrade() -> None:
    op.drop_index('ix_steps_ready_agent', table_name='steps', postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))
    op.drop_table('flow_buckets')
    op.drop_index('ix_flow_limits_agent', table_name='flow_limits')
    op.drop_table('flow_limits')
    with op.batch_alter_table('agent_instances') as batch:
        batch.drop_column('breakers_open_for')
        batch.drop_column('actions')
