"""The audit trail of actions that have no run to record an event on: dead letters (they live
in RabbitMQ), pruned runs (their events go with them), tokens, limits, schedules, expired
subscribers; read by `sasflow audit list`, kept `SASFLOW_RETAIN_AUDIT_DAYS`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from sasflow.store.schema import audit
from sasflow.store.sqltime import now, plus_seconds


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
    conn: Connection,
    *,
    action: str | None = None,
    limit: int = 100,
    since: datetime | float | None = None,
    actor: str | None = None,
) -> list[dict[str, Any]]:
    """The latest records, newest first, created at or after `since` (a time, or seconds
    before the database's now), by `actor`, of
    `action` (an exact name, or a prefix ending in `.`: `dead.`) (primary key backwards;
    ix_audit_created_at with `since`)."""
    query = select(audit).order_by(audit.c.id.desc()).limit(limit)
    if action is not None:
        if action.endswith("."):
            query = query.where(audit.c.action.startswith(action, autoescape=True))
        else:
            query = query.where(audit.c.action == action)
    if isinstance(since, datetime):
        query = query.where(audit.c.created_at >= since)
    elif since is not None:
        query = query.where(audit.c.created_at >= plus_seconds(now(), -float(since)))
    if actor is not None:
        query = query.where(audit.c.actor == actor)
    return [dict(r._mapping) for r in conn.execute(query)]


def prune(conn: Connection, *, keep_s: float, batch: int) -> int:
    """Delete up to `batch` records created more than `keep_s` seconds ago by the database's
    clock, the oldest first; returns how many (ix_audit_created_at)."""
    oldest = (
        select(audit.c.id)
        .where(audit.c.created_at < plus_seconds(now(), -keep_s))
        .order_by(audit.c.created_at, audit.c.id)
        .limit(batch)
    )
    return int(conn.execute(delete(audit).where(audit.c.id.in_(oldest.scalar_subquery()))).rowcount)


def database_now(conn: Connection) -> datetime:
    """The database's clock (the transaction's timestamp)."""
    value: datetime = conn.execute(select(now())).scalar_one()
    return value
