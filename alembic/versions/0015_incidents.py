"""incidents: alerts of one cause grouped while it is open, each alert's incident

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 15:45:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# `now()` on PostgreSQL; the strftime() form on SQLite (see sasflow.store.sqltime).
from sasflow.store.sqltime import now

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", _ID, sa.Identity(always=False), nullable=False),
        sa.Column("kind", sa.String(length=50), nullable=False),
        sa.Column("cause_key", sa.String(length=64), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("workflow", sa.String(length=100), nullable=True),
        sa.Column("alert_count", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), server_default=now(), nullable=False),
        sa.Column("acknowledged", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("acknowledged_by", sa.String(length=200), nullable=True),
        sa.Column("acknowledge_reason", sa.Text(), nullable=True),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reminded_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index(
        "uq_incidents_open_cause_key",
        "incidents",
        ["cause_key"],
        unique=True,
        postgresql_where=sa.text("NOT acknowledged"),
        sqlite_where=sa.text("NOT acknowledged"),
    )
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("incident_id", _ID, nullable=True))
        batch.create_foreign_key(
            op.f("fk_alerts_incident_id_incidents"),
            "incidents",
            ["incident_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index("ix_alerts_incident_id", ["incident_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_index("ix_alerts_incident_id")
        batch.drop_constraint(op.f("fk_alerts_incident_id_incidents"), type_="foreignkey")
        batch.drop_column("incident_id")
    op.drop_index(
        "uq_incidents_open_cause_key",
        table_name="incidents",
        postgresql_where=sa.text("NOT acknowledged"),
        sqlite_where=sa.text("NOT acknowledged"),
    )
    op.drop_table("incidents")
