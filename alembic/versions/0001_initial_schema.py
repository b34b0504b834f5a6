"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 02:55:22.362429
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# `now()` on PostgreSQL, the same DDL as before; SQLite's DEFAULT takes no now(), so there it
# is the strftime() form of SQLAlchemy's DateTime text (see sasflow.store.sqltime).
from sasflow.store.sqltime import now
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), sa.Identity(always=False), nullable=False),
    sa.Column('workflow', sa.String(length=100), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('business_key', sa.String(length=200), nullable=False),
    sa.Column('input', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('priority', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('state', sa.String(length=20), server_default=sa.text("'pending'"), nullable=False),
    sa.Column('reply_to', sa.String(length=255), nullable=True),
    sa.Column('output', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('error', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('workflow', 'business_key', name=op.f('uq_runs_workflow_business_key'))
    )
    op.create_index('ix_runs_state_created_at', 'runs', ['state', 'created_at'], unique=False)
    op.create_table('schedulers',
    sa.Column('id', sa.String(length=100), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('draining', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('claimed', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('applied', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedulers'))
    )
    op.create_table('alerts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), sa.Identity(always=False), nullable=False),
    sa.Column('run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('step_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('kind', sa.String(length=50), nullable=False),
    sa.Column('dedup_key', sa.String(length=200), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('detail', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('acknowledged', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('acknowledged_by', sa.String(length=200), nullable=True),
    sa.Column('acknowledged_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_alerts_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alerts'))
    )
    op.create_index('uq_alerts_open_dedup_key', 'alerts', ['dedup_key'], unique=True, postgresql_where=sa.text('NOT acknowledged'), sqlite_where=sa.text('NOT acknowledged'))
    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), sa.Identity(always=False), nullable=False),
    sa.Column('run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('step_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('entity', sa.String(length=10), nullable=False),
    sa.Column('step', sa.String(length=100), nullable=True),
    sa.Column('from_state', sa.String(length=20), nullable=True),
    sa.Column('to_state', sa.String(length=20), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('detail', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('published', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_events_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    op.create_index('ix_events_run_id_id', 'events', ['run_id', 'id'], unique=False)
    op.create_index('ix_events_unpublished', 'events', ['id'], unique=False, postgresql_where=sa.text('NOT published'), sqlite_where=sa.text('NOT published'))
    op.create_table('steps',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), sa.Identity(always=False), nullable=False),
    sa.Column('run_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('kind', sa.String(length=20), server_default=sa.text("'forward'"), nullable=False),
    sa.Column('agent', sa.String(length=100), nullable=False),
    sa.Column('action', sa.String(length=100), nullable=False),
    sa.Column('compensate_action', sa.String(length=100), nullable=True),
    sa.Column('depends_on', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('priority', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('locked_by', sa.String(length=100), nullable=True),
    sa.Column('complete_by', sa.DateTime(timezone=True), nullable=True),
    sa.Column('dispatched_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('not_before', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('deferred_since', sa.DateTime(timezone=True), nullable=True),
    sa.Column('failure_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('attempt', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('idempotency_key', sa.String(length=100), nullable=False),
    sa.Column('input', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('output', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('error', sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('timeout_s', sa.Float(), nullable=False),
    sa.Column('max_failures', sa.Integer(), nullable=False),
    sa.Column('backoff_initial_s', sa.Float(), nullable=False),
    sa.Column('backoff_multiplier', sa.Float(), nullable=False),
    sa.Column('backoff_max_s', sa.Float(), nullable=False),
    sa.Column('give_up_s', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_steps_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_steps')),
    sa.UniqueConstraint('run_id', 'kind', 'name', name=op.f('uq_steps_run_id_kind_name'))
    )
    op.create_index('ix_steps_expiry', 'steps', ['complete_by'], unique=False, postgresql_where=sa.text("state = 'processing'"), sqlite_where=sa.text("state = 'processing'"))
    op.create_index('ix_steps_ready', 'steps', [sa.literal_column('priority DESC'), 'not_before', 'id'], unique=False, postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))


def downgrade() -> None:
    op.drop_index('ix_steps_ready', table_name='steps', postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))
    op.drop_index('ix_steps_expiry', table_name='steps', postgresql_where=sa.text("state = 'processing'"), sqlite_where=sa.text("state = 'processing'"))
    op.drop_table('steps')
    op.drop_index('ix_events_unpublished', table_name='events', postgresql_where=sa.text('NOT published'), sqlite_where=sa.text('NOT published'))
    op.drop_index('ix_events_run_id_id', table_name='events')
    op.drop_table('events')
    op.drop_index('uq_alerts_open_dedup_key', table_name='alerts', postgresql_where=sa.text('NOT acknowledged'), sqlite_where=sa.text('NOT acknowledged'))
    op.drop_table('alerts')
    op.drop_table('schedulers')
    op.drop_index('ix_runs_state_created_at', table_name='runs')
    op.drop_table('runs')
