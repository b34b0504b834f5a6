"""A run's `paused` flag (ops/pause.py): the claim takes none of a paused run's steps."""

from __future__ import annotations

from sqlalchemy import Connection, update

from sasflow.store.schema import runs
from sasflow.store.sqltime import now


def set_paused(conn: Connection, run_id: int, paused: bool) -> bool:
    """Set the run's flag (primary key); whether it changed."""
    changed = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.paused.is_not(paused))
        .values(paused=paused, updated_at=now())
    )
    return changed.rowcount == 1
