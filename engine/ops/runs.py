"""Inspect runs: list them with filters, show one with its steps and event timeline."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, select

from sasflow.errors import SasflowError
from sasflow.store.schema import events, runs, steps
from sasflow.store.sqltime import now, plus_seconds


class RunNotFoundError(SasflowError):
    """No run with that id."""


@dataclass(frozen=True)
class RunFilter:
    """Which runs an operator means; times are absolute or seconds before the database's now."""

    states: tuple[str, ...] = ()
    workflow: str | None = None
    key: str | None = None
    since: datetime | float | None = None
    until: datetime | float | None = None
    limit: int = 100

    def conditions(self) -> list[ColumnElement[bool]]:
        found: list[ColumnElement[bool]] = []
        if self.states:
            found.append(runs.c.state.in_(self.states))
        if self.workflow:
            found.append(runs.c.workflow == self.workflow)
        if self.key:
            found.append(runs.c.business_key == self.key)
        if self.since is not None:
            found.append(runs.c.created_at >= _moment(self.since))
        if self.until is not None:
            found.append(runs.c.created_at < _moment(self.until))
        return found


def _moment(value: datetime | float) -> Any:
    if isinstance(value, datetime):
        return value
    return plus_seconds(now(), -float(value))


RUN_COLUMNS = (
    runs.c.id,
    runs.c.workflow,
    runs.c.version,
    runs.c.business_key,
    runs.c.state,
    runs.c.priority,
    runs.c.created_at,
    runs.c.updated_at,
    runs.c.finished_at,
    runs.c.error,
)


def list_runs(conn: Connection, where: RunFilter) -> list[dict[str, Any]]:
    """Runs matching `where`, newest first (ix_runs_state_created_at serves state filters)."""
    query = (
        select(*RUN_COLUMNS)
        .where(*where.conditions())
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(where.limit)
    )
    return [dict(r._mapping) for r in conn.execute(query)]


def show_run(conn: Connection, run_id: int) -> dict[str, Any]:
    """The run, its steps (forward then compensation) and its whole event timeline."""
    run = conn.execute(select(runs).where(runs.c.id == run_id)).first()
    if run is None:
        raise RunNotFoundError(f"no run with id {run_id}")
    step_rows = conn.execute(
        select(
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
            steps.c.not_before,
            steps.c.error,
            steps.c.input,
            steps.c.output,
            steps.c.idempotency_key,
        )
        .where(steps.c.run_id == run_id)
        .order_by(steps.c.kind.desc(), steps.c.id)
    )
    timeline = conn.execute(
        select(
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
        .where(events.c.run_id == run_id)
        .order_by(events.c.id)
    )
    return {
        "run": dict(run._mapping),
        "steps": [dict(r._mapping) for r in step_rows],
        "events": [dict(r._mapping) for r in timeline],
    }
