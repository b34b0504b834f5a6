"""The statements of history retention: find finished runs past their retention, read them for the
archive, delete them (steps, events and alerts go with them: ON DELETE CASCADE; the inbound
events their waits consumed are deleted just before, in the same transaction); and the marks of
when the retention next needs to look at what it cannot query by age."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, delete, exists, literal, select

from sasflow.states import RunState
from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import alerts, events, inbound_events, retention_marks, runs, steps
from sasflow.store.sqltime import now, plus_seconds


@dataclass(frozen=True)
class RetentionRule:
    """Runs in `states` are kept `keep_s` seconds after they finished."""

    states: tuple[RunState, ...]
    keep_s: float


def _past_retention(rule: RetentionRule) -> list[ColumnElement[bool]]:
    # Repeating the partial index's predicate lets the planner use ix_runs_finished_at.
    return [
        runs.c.finished_at.is_not(None),
        runs.c.finished_at < plus_seconds(now(), -rule.keep_s),
        runs.c.state.in_(sorted(rule.states)),
        # A run with an open alert waits until someone acknowledged it (ix_alerts_run_id).
        ~exists(
            select(alerts.c.id).where(
                alerts.c.run_id == runs.c.id, alerts.c.acknowledged.is_(False)
            )
        ),
    ]


def lock_prunable(conn: Connection, rule: RetentionRule, *, batch: int) -> list[int]:
    """Up to `batch` ids of runs past `rule`, the longest finished first, locked; a run another
    transaction holds is skipped, never waited for (ix_runs_finished_at)."""
    query = (
        select(runs.c.id)
        .where(*_past_retention(rule))
        .order_by(runs.c.finished_at, runs.c.id)
        .limit(batch)
        .with_for_update(skip_locked=True)
    )
    return list(conn.execute(query).scalars())


def prunable_ids(conn: Connection, rule: RetentionRule) -> list[int]:
    """Every id of a run past `rule`, the longest finished first, unlocked: what a prune would
    delete now (ix_runs_finished_at)."""
    query = select(runs.c.id).where(*_past_retention(rule)).order_by(runs.c.finished_at, runs.c.id)
    return list(conn.execute(query).scalars())


def archive(conn: Connection, run_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Each run with its steps, events, alerts and the inbound events its waits consumed, in
    `run_ids` order (primary key, uq_steps_run_id_kind_name, ix_events_run_id_id,
    ix_alerts_run_id, ux_inbound_events_step)."""
    ids = list(run_ids)
    found = {r.id: dict(r._mapping) for r in conn.execute(select(runs).where(runs.c.id.in_(ids)))}
    for run in found.values():
        run["steps"], run["events"], run["alerts"], run["inbound_events"] = [], [], [], []
    for key, table in (("steps", steps), ("events", events), ("alerts", alerts)):
        rows = conn.execute(select(table).where(table.c.run_id.in_(ids)).order_by(table.c.id))
        for row in rows:
            found[row.run_id][key].append(dict(row._mapping))
    consumed = (
        select(inbound_events, steps.c.run_id)
        .join(steps, steps.c.id == inbound_events.c.consumed_step_id)
        .where(steps.c.run_id.in_(ids))
        .order_by(inbound_events.c.id)
    )
    for row in conn.execute(consumed):
        event = dict(row._mapping)
        found[event.pop("run_id")]["inbound_events"].append(event)
    return [found[i] for i in ids if i in found]


def delete_consumed_events(conn: Connection, run_ids: Sequence[int]) -> int:
    """Delete the inbound events the waits of the runs (locked by the caller) consumed: they
    go with their run, and with them the deduplication of their ids. Returns how many
    (uq_steps_run_id_kind_name, then ux_inbound_events_step)."""
    if not run_ids:
        return 0
    their_steps = select(steps.c.id).where(steps.c.run_id.in_(list(run_ids)))
    return conn.execute(
        delete(inbound_events).where(inbound_events.c.consumed_step_id.in_(their_steps))
    ).rowcount


def delete_runs(conn: Connection, run_ids: Sequence[int]) -> int:
    """Delete the runs (locked by the caller); the foreign keys cascade to their steps
    (uq_steps_run_id_kind_name), events (ix_events_run_id_id) and alerts (ix_alerts_run_id).
    Returns how many (primary key)."""
    if not run_ids:
        return 0
    return conn.execute(delete(runs).where(runs.c.id.in_(list(run_ids)))).rowcount


def is_due(conn: Connection, name: str) -> bool:
    """Whether `name` needs a look now: never marked, or marked due at or before the
    database's now (primary key)."""
    later = conn.execute(
        select(literal(1)).where(retention_marks.c.name == name, retention_marks.c.due_at > now())
    ).first()
    return later is None


def mark_due(conn: Connection, name: str, in_seconds: float) -> None:
    """Record that `name` needs a look again `in_seconds` from the database's now (primary
    key)."""
    due = plus_seconds(now(), max(0.0, in_seconds))
    conn.execute(
        upsert_insert(conn, retention_marks)
        .values(name=name, due_at=due)
        .on_conflict_do_update(index_elements=[retention_marks.c.name], set_={"due_at": due})
    )
