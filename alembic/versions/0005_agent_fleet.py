"""agent fleet: agent_instances, fleet events without a run

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# `now()` on PostgreSQL; the strftime() form on SQLite (see sasflow.store.sqltime).
from sasflow.store.sqltime import now

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('agent_instances',
    sa.Column('instance_id', sa.String(length=100), nullable=False),
    sa.Column('agent', sa.String(length=100), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('version', sa.String(length=50), nullable=False),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('in_flight', sa.Integer(), nullable=False),
    sa.Column('breakers', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('interval_s', sa.Float(), nullable=False),
    sa.Column('seq', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('first_seen_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('gone_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('instance_id', name=op.f('pk_agent_instances'))
    )
    op.create_index('ix_agent_instances_live', 'agent_instances', ['heartbeat_at'], unique=False, postgresql_where=sa.text("state = 'live'"), sqlite_where=sa.text("state = 'live'"))
    # Fleet events (entity "agent") belong to no run.
    with op.batch_alter_table('events') as batch_op:
        batch_op.alter_column('run_id', existing_type=sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM events WHERE run_id IS NULL")
    with op.batch_alter_table('events') as batch_op:
        batch_op.alter_column('run_id', existing_type=sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False)
    op.drop_index('ix_agent_instances_live', table_name='agent_instances', postgresql_where=sa.text("state = 'live'"), sqlite_where=sa.text("state = 'live'"))
    op.drop_table('agent_instances')
