"""alert deliveries: the sinks that took each alert, attempts, errors, the next retry

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 09:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from sqlalchemy.dialects import postgresql

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), 'postgresql')


def upgrade() -> None:
    with op.batch_alter_table('alerts') as batch:
        batch.add_column(sa.Column('delivered_to', _JSON, nullable=True))
        batch.add_column(sa.Column('delivery_attempts', sa.Integer(), server_default=sa.text('0'), nullable=False))
        batch.add_column(sa.Column('delivery_errors', _JSON, nullable=True))
        batch.add_column(sa.Column('retry_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('alerts') as batch:
        batch.drop_column('retry_at')
        batch.drop_column('delivery_errors')
        batch.drop_column('delivery_attempts')
        batch.drop_column('delivered_to')
