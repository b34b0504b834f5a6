"""The audit trail of actions that have no run to record an event on: dead letters (they live
in RabbitMQ) and pruned runs (their events go with them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update

from sasflow.store.schema import audit
from sasflow.store.sqltime import now


@dataclass(frozen=True)
class AuditRecord:
    actor: str
    action: str
    """What was done: `dead.replay`, `dead.purge`, `runs.prune`."""
    reason: str | None
    detail: Any = None


def record(conn: Connection, entry: AuditRecord) -> int:
    """Append `entry`; returns its id."""
    return int(
        conn.execute(
            insert(audit)
            .values(
                actor=entry.actor, action=entry.action, reason=entry.reason, detail=entry.detail
            )
            .returning(audit.c.id)
        ).scalar_one()
    )


def update_detail(conn: Connection, audit_id: int, detail: Any) -> None:
    """Bring a running action's record up to date, in the transaction of its latest step
    (primary key)."""
    conn.execute(
        update(audit).where(audit.c.id == audit_id).values(detail=detail, updated_at=now())
    )


def recent(
    conn: Connection, *, action: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The latest records, newest first (primary key, backwards)."""
    query = select(audit).order_by(audit.c.id.desc()).limit(limit)
    if action is not None:
        query = query.where(audit.c.action == action)
    return [dict(r._mapping) for r in conn.execute(query)]


def database_now(conn: Connection) -> datetime:
    """The database's clock (the transaction's timestamp)."""
    value: datetime = conn.execute(select(now())).scalar_one()
    return value
