"""The trace context stored with each run (read and written only when tracing is on)."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Connection, select, update

from sasflow.store.schema import runs


def trace_parents(conn: Connection, run_ids: Collection[int]) -> dict[int, str | None]:
    """The stored traceparent of each run in `run_ids` (served by the runs primary key)."""
    if not run_ids:
        return {}
    rows = conn.execute(
        select(runs.c.id, runs.c.trace_parent).where(runs.c.id.in_(sorted(run_ids)))
    ).all()
    return {row.id: row.trace_parent for row in rows}


def set_trace_parent(conn: Connection, run_id: int, trace_parent: str) -> str:
    """Store `trace_parent` for a run that has none yet; returns the one the run keeps (served
    by the runs primary key)."""
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.trace_parent.is_(None))
        .values(trace_parent=trace_parent)
    )
    kept = conn.execute(select(runs.c.trace_parent).where(runs.c.id == run_id)).scalar()
    return kept or trace_parent
