"""http api: tokens, callbacks outbox, who submitted a run, agent pools

Revision ID: 0006
Revises: 0003
Create Date: 2026-11-24 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# `now()` on PostgreSQL; the strftime() form on SQLite (see sasflow.store.sqltime).
from sasflow.store.sqltime import now

revision: str = '0006'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', ID, sa.Identity(always=False), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('scopes', JSON, nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    op.create_index('uq_api_tokens_live_name', 'api_tokens', ['name'], unique=True, postgresql_where=sa.text('revoked_at IS NULL'), sqlite_where=sa.text('revoked_at IS NULL'))
    op.create_table('callbacks',
    sa.Column('id', ID, sa.Identity(always=False), nullable=False),
    sa.Column('run_id', ID, nullable=False),
    sa.Column('url', sa.String(length=2000), nullable=False),
    sa.Column('idempotency_key', sa.String(length=100), nullable=False),
    sa.Column('payload', JSON, nullable=False),
    sa.Column('state', sa.String(length=20), server_default=sa.text("'pending'"), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_callbacks_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_callbacks')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_callbacks_idempotency_key'))
    )
    op.create_index('ix_callbacks_run_id', 'callbacks', ['run_id'], unique=False)
    op.create_index('ix_callbacks_due', 'callbacks', ['next_attempt_at'], unique=False, postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('submitted_by', sa.String(length=100), nullable=True))
        batch.add_column(sa.Column('callback_url', sa.String(length=2000), nullable=True))
        batch.add_column(sa.Column('pool', sa.String(length=100), nullable=True))
    with op.batch_alter_table('steps') as batch:
        batch.add_column(sa.Column('pool', sa.String(length=100), nullable=True))
        batch.add_column(sa.Column('pool_looks', sa.Integer(), server_default=sa.text('0'), nullable=False))
        batch.add_column(sa.Column('pool_waiting_since', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('steps') as batch:
        batch.drop_column('pool_waiting_since')
        batch.drop_column('pool_looks')
        batch.drop_column('pool')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('pool')
        batch.drop_column('callback_url')
        batch.drop_column('submitted_by')
    op.drop_index('ix_callbacks_due', table_name='callbacks', postgresql_where=sa.text("state = 'pending'"), sqlite_where=sa.text("state = 'pending'"))
    op.drop_index('ix_callbacks_run_id', table_name='callbacks')
    op.drop_table('callbacks')
    op.drop_index('uq_api_tokens_live_name', table_name='api_tokens', postgresql_where=sa.text('revoked_at IS NULL'), sqlite_where=sa.text('revoked_at IS NULL'))
    op.drop_table('api_tokens')
