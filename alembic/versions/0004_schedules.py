"""schedules: recurring schedules, their ticks, the scheduler registry and its offline list

Revision ID: 0004
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

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
_JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    # Batch mode: SQLite cannot ADD a column whose default is not a constant (now()).
    with op.batch_alter_table('schedulers') as batch:
        batch.add_column(sa.Column('name', sa.String(length=100), server_default=sa.text("''"), nullable=False))
        batch.add_column(sa.Column('address', sa.String(length=255), server_default=sa.text("''"), nullable=False))
        batch.add_column(sa.Column('fault_tolerance', sa.Integer(), server_default=sa.text('1'), nullable=False))
        batch.add_column(sa.Column('alarm_threshold', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('held', sa.Integer(), server_default=sa.text('0'), nullable=False))
        batch.add_column(sa.Column('lease_ttl_s', sa.Float(), server_default=sa.text('10'), nullable=False))
        batch.add_column(sa.Column('lease_expires_at', sa.DateTime(timezone=True), server_default=now(), nullable=False))
        batch.create_index('ix_schedulers_lease_expires_at', ['lease_expires_at'], unique=False)
        batch.create_index('ix_schedulers_name', ['name'], unique=False)
    op.create_table('scheduler_offline',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('since', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_scheduler_offline'))
    )
    op.create_table('schedules',
    sa.Column('id', _ID, sa.Identity(always=False), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('workflow', sa.String(length=100), nullable=False),
    sa.Column('input', _JSON, nullable=False),
    sa.Column('cron', sa.String(length=200), nullable=True),
    sa.Column('interval_s', sa.Float(), nullable=True),
    sa.Column('timezone', sa.String(length=64), server_default=sa.text("'UTC'"), nullable=False),
    sa.Column('catch_up', sa.String(length=10), server_default=sa.text("'latest'"), nullable=False),
    sa.Column('max_catch_up', sa.Integer(), server_default=sa.text('10'), nullable=False),
    sa.Column('source', sa.String(length=10), server_default=sa.text("'cli'"), nullable=False),
    sa.Column('paused', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('owner', sa.String(length=100), nullable=True),
    sa.Column('acquired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('next_tick_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_tick_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedules')),
    sa.UniqueConstraint('name', name=op.f('uq_schedules_name'))
    )
    op.create_index('ix_schedules_owner_next_tick_at', 'schedules', ['owner', 'next_tick_at'], unique=False)
    op.create_table('schedule_ticks',
    sa.Column('id', _ID, sa.Identity(always=False), nullable=False),
    sa.Column('schedule_id', _ID, nullable=False),
    sa.Column('tick_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('run_id', _ID, nullable=True),
    sa.Column('fired_by', sa.String(length=200), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('fired_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
    sa.ForeignKeyConstraint(['schedule_id'], ['schedules.id'], name=op.f('fk_schedule_ticks_schedule_id_schedules'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedule_ticks')),
    sa.UniqueConstraint('schedule_id', 'tick_at', name=op.f('uq_schedule_ticks_schedule_id_tick_at'))
    )


def downgrade() -> None:
    op.drop_table('schedule_ticks')
    op.drop_index('ix_schedules_owner_next_tick_at', table_name='schedules')
    op.drop_table('schedules')
    op.drop_table('scheduler_offline')
    with op.batch_alter_table('schedulers') as batch:
        batch.drop_index('ix_schedulers_name')
        batch.drop_index('ix_schedulers_lease_expires_at')
        for column in ('lease_expires_at', 'lease_ttl_s', 'held', 'alarm_threshold', 'fault_tolerance', 'address', 'name'):
            batch.drop_column(column)
