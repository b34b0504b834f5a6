"""Read-only queries for people: the operator's run listings and run detail, and the counts
the demo shows of its own runs (those whose business key starts with its prefix)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, Select, Text, cast, exists, func, or_, select

from sasflow.states import RunState, StepKind, StepState
from sasflow.store.runs.parked import has_parked_step
from sasflow.store.schema import alerts, events, runs, steps
from sasflow.store.sqltime import now, plus_seconds

TEXT_SCAN_ROWS = 100_000
"""How many of the newest runs (by id) a text search looks through at most."""


@dataclass(frozen=True)
class RunFilter:
    """Which runs an operator means; times are absolute or seconds before the database's now."""

    states: tuple[str, ...] = ()
    workflow: str | None = None
    key: str | None = None
    since: datetime | float | None = None
    until: datetime | float | None = None
    limit: int = 100
    key_contains: str | None = None
    """Free text the business key contains (case-insensitive)."""
    ids: tuple[int, ...] = ()
    """Only these runs (an operator's selection)."""
    text: str | None = None
    """Free text found (case-insensitive) in the business key, the text of the run's input,
    output or error (JSON), or the error of any of its steps; looked for among the newest
    `text_scan` runs only, so that a search costs a bounded scan."""
    text_scan: int = TEXT_SCAN_ROWS
    parked: bool = False
    """Only runs with a parked step (docs/operations.md "Parked steps"; ix_steps_parked)."""


def _conditions(where: RunFilter) -> list[ColumnElement[bool]]:
    found: list[ColumnElement[bool]] = []
    if where.states:
        found.append(runs.c.state.in_(where.states))
    if where.workflow:
        found.append(runs.c.workflow == where.workflow)
    if where.key:
        found.append(runs.c.business_key == where.key)
    if where.since is not None:
        found.append(runs.c.created_at >= _moment(where.since))
    if where.until is not None:
        found.append(runs.c.created_at < _moment(where.until))
    if where.key_contains:
        found.append(runs.c.business_key.icontains(where.key_contains, autoescape=True))
    if where.ids:
        found.append(runs.c.id.in_(where.ids))
    if where.text:
        found.extend(_text_conditions(where.text, where.text_scan))
    if where.parked:
        found.append(has_parked_step())
    return found


def _text_conditions(text: str, scan: int) -> list[ColumnElement[bool]]:
    """The text in the key, the run's JSON documents or a step's error, among the newest
    `scan` runs: a range of the primary key below its max (an index lookup), each row then
    tested (the JSON cast to text; uq_steps_run_id_kind_name finds a run's steps)."""

    def has(column: Any) -> ColumnElement[bool]:
        return cast(column, Text).icontains(text, autoescape=True)

    floor = select(func.coalesce(func.max(runs.c.id), 0)).scalar_subquery() - scan
    # The steps' bound too: PostgreSQL may hash the subquery, reading every step it selects.
    step_error = exists().where(
        steps.c.run_id == runs.c.id, steps.c.run_id > floor, has(steps.c.error)
    )
    matches = or_(
        runs.c.business_key.icontains(text, autoescape=True),
        has(runs.c.input),
        has(runs.c.output),
        has(runs.c.error),
        step_error,
    )
    return [runs.c.id > floor, matches]


def _moment(value: datetime | float) -> Any:
    if isinstance(value, datetime):
        return value
    return plus_seconds(now(), -float(value))


_RUN_COLUMNS = (
    runs.c.id,
    runs.c.workflow,
    runs.c.version,
    runs.c.business_key,
    runs.c.state,
    runs.c.priority,
    runs.c.submitted_by,
    runs.c.pool,
    runs.c.created_at,
    runs.c.updated_at,
    runs.c.finished_at,
    runs.c.error,
    has_parked_step().label("parked"),
)

_STEP_COLUMNS = (
    steps.c.id,
    steps.c.name,
    steps.c.kind,
    steps.c.agent,
    steps.c.action,
    steps.c.state,
    steps.c.attempt,
    steps.c.failure_count,
    steps.c.max_failures,
    steps.c.locked_by,
    steps.c.complete_by,
    steps.c.started_at,
    steps.c.wait_expiries,
    steps.c.not_before,
    steps.c.error,
    steps.c.input,
    steps.c.output,
    steps.c.idempotency_key,
    steps.c.map_parent,
    steps.c.map_index,
)

_EVENT_COLUMNS = (
    events.c.id,
    events.c.created_at,
    events.c.entity,
    events.c.step_id,
    events.c.step,
    events.c.from_state,
    events.c.to_state,
    events.c.attempt,
    events.c.actor,
    events.c.reason,
    events.c.detail,
)


def list_runs(conn: Connection, where: RunFilter) -> list[dict[str, Any]]:
    """Runs matching `where`, newest first (ix_runs_state_created_at serves state filters)."""
    query = (
        select(*_RUN_COLUMNS)
        .where(*_conditions(where))
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(where.limit)
    )
    return [dict(r._mapping) for r in conn.execute(query)]


def runs_page(conn: Connection, where: RunFilter, *, before_id: int | None) -> list[dict[str, Any]]:
    """One page of the runs matching `where`, newest id first, those below `before_id` (the
    cursor) only (primary key; ix_runs_state_created_at narrows state filters)."""
    query = select(*_RUN_COLUMNS).where(*_conditions(where))
    if before_id is not None:
        query = query.where(runs.c.id < before_id)
    return [
        dict(r._mapping) for r in conn.execute(query.order_by(runs.c.id.desc()).limit(where.limit))
    ]


def select_run_ids(conn: Connection, where: RunFilter) -> list[int]:
    """The ids of the runs matching `where`, oldest first (ix_runs_state_created_at serves state
    filters)."""
    query = (
        select(runs.c.id)
        .where(*_conditions(where))
        .order_by(runs.c.created_at, runs.c.id)
        .limit(where.limit)
    )
    return list(conn.execute(query).scalars())


def run_row(conn: Connection, run_id: int) -> dict[str, Any] | None:
    """The run's row alone, or None (primary key)."""
    run = conn.execute(select(runs).where(runs.c.id == run_id)).first()
    return None if run is None else dict(run._mapping)


def run_detail(
    conn: Connection, run_id: int, *, map_items: int | None = None
) -> dict[str, Any] | None:
    """The run, its steps (forward then compensation) and its whole event timeline (primary
    key, uq_steps_run_id_kind_name, ix_events_run_id_id); None when there is no such run.
    `map_items`: only the first `map_items` items of each map (by index), and `map_counts`
    (map_item_counts); None: every item."""
    run = conn.execute(select(runs).where(runs.c.id == run_id)).first()
    if run is None:
        return None
    wanted = select(*_STEP_COLUMNS).where(steps.c.run_id == run_id)
    if map_items is not None:
        wanted = wanted.where(
            or_(
                steps.c.map_parent.is_(None),
                steps.c.kind != StepKind.FORWARD,
                steps.c.map_index < map_items,
            )
        )
    step_rows = conn.execute(wanted.order_by(steps.c.kind.desc(), steps.c.id))
    timeline = conn.execute(
        select(*_EVENT_COLUMNS).where(events.c.run_id == run_id).order_by(events.c.id)
    )
    found = {
        "run": dict(run._mapping),
        "steps": [dict(r._mapping) for r in step_rows],
        "events": [dict(r._mapping) for r in timeline],
    }
    if map_items is not None:
        found["map_counts"] = map_item_counts(conn, run_id)
    return found


def map_item_counts(conn: Connection, run_id: int) -> dict[int, dict[str, int]]:
    """How many items each map of the run has in each state: map record id -> state -> count
    (uq_steps_run_id_kind_name: the run's steps)."""
    rows = conn.execute(
        select(steps.c.map_parent, steps.c.state, func.count())
        .where(
            steps.c.run_id == run_id,
            steps.c.kind == StepKind.FORWARD,
            steps.c.map_parent.is_not(None),
        )
        .group_by(steps.c.map_parent, steps.c.state)
    )
    found: dict[int, dict[str, int]] = {}
    for parent, state, count in rows:
        found.setdefault(int(parent), {})[str(state)] = int(count)
    return found


def recent_runs_by_state(conn: Connection, *, seconds: float) -> dict[str, int]:
    """How many runs created in the last `seconds` (database clock) are in each state (no
    index leads with created_at: a scan of runs, which the console's overview pays on each
    refresh)."""
    rows = conn.execute(
        select(runs.c.state, func.count())
        .where(runs.c.created_at >= plus_seconds(now(), -seconds))
        .group_by(runs.c.state)
    )
    return {str(state): int(count) for state, count in rows}


def finished_since(conn: Connection, *, seconds: float) -> int:
    """How many runs finished in the last `seconds` (database clock): throughput (no index
    serves finished_at: a scan of runs)."""
    query = (
        select(func.count())
        .select_from(runs)
        .where(runs.c.finished_at >= plus_seconds(now(), -seconds))
    )
    return int(conn.execute(query).scalar_one())


# -- the runs of one business-key prefix (the demo's) --------------------------------------


def _keyed(prefix: str) -> ColumnElement[bool]:
    return runs.c.business_key.startswith(prefix, autoescape=True)


@dataclass(frozen=True)
class PrefixCounts:
    """What the store holds of the runs whose business key starts with a prefix."""

    runs_by_state: dict[str, int]
    steps_retried: int
    """Steps dispatched more than once (attempt > 1)."""
    failures_counted: int
    """Sum of the steps' failure counts."""
    deferred: int
    """Step events back to pending with reason `deferred` (an open circuit breaker)."""
    expired_recovered: int
    """Step events back to pending with reason `expired` (the supervisor's sweep)."""
    compensations_processed: int
    alerts_raised: int
    error_runs: list[int]
    compensated_runs: list[int]


def runs_by_state(conn: Connection, prefix: str) -> dict[str, int]:
    """How many of the prefix's runs are in each state (a scan of runs: no index serves a key
    prefix across workflows)."""
    rows = conn.execute(
        select(runs.c.state, func.count()).where(_keyed(prefix)).group_by(runs.c.state)
    )
    return {str(state): int(count) for state, count in rows}


def count_prefix(conn: Connection, prefix: str) -> PrefixCounts:
    """The counts of the prefix's runs, steps, events and alerts (a scan of runs, then
    uq_steps_run_id_kind_name and ix_events_run_id_id per run; alerts are scanned)."""
    ids = select(runs.c.id).where(_keyed(prefix)).scalar_subquery()

    def count(query: Select[Any]) -> int:
        return int(conn.execute(query).scalar_one())

    def step_events(reason: str) -> int:
        return count(
            select(func.count())
            .select_from(events)
            .where(
                events.c.run_id.in_(ids),
                events.c.entity == "step",
                events.c.reason == reason,
                events.c.to_state == StepState.PENDING,
            )
        )

    def ids_in(state: str) -> list[int]:
        return list(
            conn.execute(
                select(runs.c.id).where(_keyed(prefix), runs.c.state == state).order_by(runs.c.id)
            ).scalars()
        )

    by_state = runs_by_state(conn, prefix)
    retried = count(
        select(func.count()).select_from(steps).where(steps.c.run_id.in_(ids), steps.c.attempt > 1)
    )
    failures = count(
        select(func.coalesce(func.sum(steps.c.failure_count), 0)).where(steps.c.run_id.in_(ids))
    )
    compensations = count(
        select(func.count())
        .select_from(steps)
        .where(
            steps.c.run_id.in_(ids),
            steps.c.kind == StepKind.COMPENSATION,
            steps.c.state == StepState.PROCESSED,
        )
    )
    raised = count(select(func.count()).select_from(alerts).where(alerts.c.run_id.in_(ids)))
    return PrefixCounts(
        runs_by_state=by_state,
        steps_retried=retried,
        failures_counted=failures,
        deferred=step_events("deferred"),
        expired_recovered=step_events("expired"),
        compensations_processed=compensations,
        alerts_raised=raised,
        error_runs=ids_in(RunState.ERROR),
        compensated_runs=ids_in(RunState.COMPENSATED),
    )


def last_event_id(conn: Connection) -> int:
    """The id of the newest event, 0 when there is none (primary key)."""
    return int(conn.execute(select(func.max(events.c.id))).scalar_one() or 0)


def prefix_events(
    conn: Connection,
    prefix: str,
    *,
    after: int,
    up_to: int,
    step_reasons: Collection[str],
    run_states: Collection[str],
    ended_reasons: Collection[str] = (),
) -> Sequence[Row[*tuple[Any, ...]]]:
    """The prefix's events with ids in (after, up_to], in order, that are steps made pending
    again for one of `step_reasons`, steps leaving `pending` for one of `ended_reasons` (an
    event wait's timeout) or runs entering one of `run_states` (primary key)."""
    return conn.execute(
        select(
            events.c.entity,
            events.c.step,
            events.c.to_state,
            events.c.reason,
            events.c.attempt,
            events.c.run_id,
            runs.c.business_key,
        )
        .join(runs, runs.c.id == events.c.run_id)
        .where(
            events.c.id > after,
            events.c.id <= up_to,
            _keyed(prefix),
            (
                (events.c.entity == "step")
                & (events.c.to_state == StepState.PENDING)
                & events.c.reason.in_(list(step_reasons))
            )
            | ((events.c.entity == "step") & events.c.reason.in_(list(ended_reasons)))
            | ((events.c.entity == "run") & events.c.to_state.in_(list(run_states))),
        )
        .order_by(events.c.id)
    ).all()


def prefix_alerts(conn: Connection, prefix: str, *, after: int) -> Sequence[Row[*tuple[Any, ...]]]:
    """The id, kind, message and run of the prefix's alerts with ids above `after`, in order
    (primary key)."""
    return conn.execute(
        select(alerts.c.id, alerts.c.kind, alerts.c.message, alerts.c.run_id)
        .join(runs, runs.c.id == alerts.c.run_id)
        .where(alerts.c.id > after, _keyed(prefix))
        .order_by(alerts.c.id)
    ).all()
