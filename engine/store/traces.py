"""The trace context stored with each run (read and written only when tracing is on)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy import Connection, bindparam, select, update

from sasflow.store.schema import runs


def trace_parents(conn: Connection, run_ids: Collection[int]) -> dict[int, str | None]:
    """The stored traceparent of each run in `run_ids` (served by the runs primary key)."""
    if not run_ids:
        return {}
    rows = conn.execute(
        select(runs.c.id, runs.c.trace_parent).where(runs.c.id.in_(sorted(run_ids)))
    ).all()
    return {row.id: row.trace_parent for row in rows}


_set_if_none = (
    update(runs)
    .where(runs.c.id == bindparam("b_id"), runs.c.trace_parent.is_(None))
    .values(trace_parent=bindparam("b_trace_parent"))
)


def set_trace_parents(conn: Connection, new: Mapping[int, str]) -> dict[int, str]:
    """Store a traceparent for each run of `new` that has none yet (one batched statement);
    returns the one each run keeps (served by the runs primary key)."""
    if not new:
        return {}
    conn.execute(
        _set_if_none,
        [{"b_id": run_id, "b_trace_parent": parent} for run_id, parent in sorted(new.items())],
    )
    kept = trace_parents(conn, new.keys())
    return {run_id: kept.get(run_id) or parent for run_id, parent in new.items()}
