"""event waits: open waits (agent 'sasflow.event') leave the claim's index (ix_steps_ready) for
their own by event and correlation and by timeout; stored inbound events

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-25 19:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sasflow.store.sqltime import now

revision: str = '0021'
down_revision: str | None = '0020'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING_NOT_TIMER = "state = 'pending' AND agent <> 'sasflow.timer'"
_PENDING_NOT_AGENTLESS = (
    "state = 'pending' AND agent <> 'sasflow.timer' AND agent <> 'sasflow.event'"
)
_OPEN_WAIT = "state = 'pending' AND agent = 'sasflow.event'"
_UNMATCHED = "consumed_at IS NULL"


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
    with op.batch_alter_table('steps') as batch:
        batch.add_column(sa.Column('correlation', sa.String(length=200), nullable=True))
    op.drop_index('ix_steps_ready', table_name='steps')
    _ready(_PENDING_NOT_AGENTLESS)
    op.create_index(
        'ix_steps_event_waits',
        'steps',
        ['action', 'correlation'],
        unique=False,
        postgresql_where=sa.text(_OPEN_WAIT),
        sqlite_where=sa.text(_OPEN_WAIT),
    )
    op.create_index(
        'ix_steps_event_timeouts',
        'steps',
        ['not_before', 'id'],
        unique=False,
        postgresql_where=sa.text(_OPEN_WAIT),
        sqlite_where=sa.text(_OPEN_WAIT),
    )
    op.create_table(
        'inbound_events',
        sa.Column(
            'id',
            sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
            sa.Identity(always=False),
            nullable=False,
        ),
        sa.Column('name', sa.String(length=100), nullable=False),
        sa.Column('event_id', sa.String(length=200), nullable=False),
        sa.Column('correlation', sa.String(length=200), nullable=False),
        sa.Column(
            'payload',
            sa.JSON(none_as_null=True).with_variant(
                postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql'
            ),
            nullable=True,
        ),
        sa.Column('source', sa.String(length=20), nullable=False),
        sa.Column('received_at', sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            'consumed_step_id',
            sa.BigInteger().with_variant(sa.Integer(), 'sqlite'),
            nullable=True,
        ),
        sa.Column('consumed_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ['consumed_step_id'],
            ['steps.id'],
            name=op.f('fk_inbound_events_consumed_step_id_steps'),
            ondelete='SET NULL',
        ),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_inbound_events')),
        sa.UniqueConstraint('name', 'event_id', name=op.f('uq_inbound_events_name_event_id')),
    )
    op.create_index(
        'ix_inbound_events_unmatched',
        'inbound_events',
        ['name', 'correlation', 'received_at'],
        unique=False,
        postgresql_where=sa.text(_UNMATCHED),
        sqlite_where=sa.text(_UNMATCHED),
    )
    op.create_index(
        'ix_inbound_events_expiry',
        'inbound_events',
        ['expires_at'],
        unique=False,
        postgresql_where=sa.text(_UNMATCHED),
        sqlite_where=sa.text(_UNMATCHED),
    )
    op.create_index(
        'ux_inbound_events_step',
        'inbound_events',
        ['consumed_step_id'],
        unique=True,
        postgresql_where=sa.text('consumed_step_id IS NOT NULL'),
        sqlite_where=sa.text('consumed_step_id IS NOT NULL'),
    )


def downgrade() -> None:
    op.drop_table('inbound_events')
    op.drop_index('ix_steps_event_timeouts', table_name='steps')
    op.drop_index('ix_steps_event_waits', table_name='steps')
    op.drop_index('ix_steps_ready', table_name='steps')
    _ready(_PENDING_NOT_TIMER)
    with op.batch_alter_table('steps') as batch:
        batch.drop_column('correlation')
