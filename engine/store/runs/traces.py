"""The trace context stored with each run (read and written only when tracing is on)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy import Connection, case, select, update

from sasflow.store.schema import runs


def trace_parents(conn: Connection, run_ids: Collection[int]) -> dict[int, str | None]:
    """The stored traceparent of each run in `run_ids` (served by the runs primary key)."""
    if not run_ids:
        return {}
    rows = conn.execute(
        select(runs.c.id, runs.c.trace_parent).where(runs.c.id.in_(sorted(run_ids)))
    ).all()
    return {row.id: row.trace_parent for row in rows}


def set_missing_trace_parents(conn: Connection, new: Mapping[int, str]) -> set[int]:
    """Store `new[run]` for each run that has no traceparent yet, in one statement; returns
    the runs that took theirs (served by the runs primary key)."""
    if not new:
        return set()
    ids = sorted(new)
    rows = conn.execute(
        update(runs)
        .where(runs.c.id.in_(ids), runs.c.trace_parent.is_(None))
        .values(trace_parent=case(new, value=runs.c.id))
        .returning(runs.c.id)
    ).all()
    return {row.id for row in rows}
