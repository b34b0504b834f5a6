"""The `schedulers` table: live scheduler instances, their heartbeat and load figures."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, update

from sasflow.store.schema import schedulers
from sasflow.store.sqltime import now


def register(conn: Connection, scheduler_id: str, *, hostname: str, pid: int) -> None:
    """Record a starting scheduler, replacing a stale row of the same id (primary key)."""
    conn.execute(delete(schedulers).where(schedulers.c.id == scheduler_id))
    conn.execute(insert(schedulers).values(id=scheduler_id, hostname=hostname, pid=pid))


def heartbeat(
    conn: Connection, scheduler_id: str, *, claimed: int, applied: int, draining: bool
) -> None:
    """Renew a scheduler's heartbeat (database clock) and its figures (primary key)."""
    conn.execute(
        update(schedulers)
        .where(schedulers.c.id == scheduler_id)
        .values(heartbeat_at=now(), claimed=claimed, applied=applied, draining=draining)
    )


def deregister(conn: Connection, scheduler_id: str) -> None:
    """Remove a stopping scheduler's row (primary key)."""
    conn.execute(delete(schedulers).where(schedulers.c.id == scheduler_id))
