"""The append-only event history: every run and step state change, and its publication outbox."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from sqlalchemy import Connection, Row, insert
from sqlalchemy.exc import DBAPIError

from sasflow.commands import FinishedRun
from sasflow.states import QUIET_STEP_STATES, TERMINAL_RUN_STATES, AgentState, RunState, StepState
from sasflow.store.dialect import capabilities
from sasflow.store.outbox import callbacks
from sasflow.store.runs import queries
from sasflow.store.schema import events


@dataclass(frozen=True)
class Event:
    """One state change, to be appended to `events`."""

    run_id: int | None
    """None for fleet events (entity "agent"), which belong to no run."""
    entity: str
    to_state: RunState | StepState | AgentState
    actor: str
    from_state: RunState | StepState | AgentState | None = None
    step_id: int | None = None
    step: str | None = None
    attempt: int | None = None
    reason: str | None = None
    detail: Any = None
    workflow: str | None = None
    """The run's workflow, on the events that end a run (what `finished_runs` reports); not a
    column: the run's row holds it."""

    def row(self) -> dict[str, Any]:
        # Step events not worth a status message (dispatches, retries): they are in the
        # history; notifications cover what applications act on.
        quiet = self.entity == "step" and self.to_state in QUIET_STEP_STATES
        # Fleet events have no run to address a status message to: the agent_lost alert is
        # their notification.
        quiet = quiet or self.run_id is None
        return {
            "run_id": self.run_id,
            "entity": self.entity,
            "to_state": self.to_state,
            "from_state": self.from_state,
            "actor": self.actor,
            "step_id": self.step_id,
            "step": self.step,
            "attempt": self.attempt,
            "reason": self.reason,
            "detail": self.detail,
            # Quiet events are born published so the relay never scans them.
            "published": quiet,
        }


COPY_FROM = 16
"""Batches of at least this many events go to PostgreSQL with COPY: 500 events (a sweep's or
a reply batch's) take ~6 ms where a pipelined executemany takes 14-22 ms (the foreign key and
index checks are the same; COPY saves the per-row statement and SQLAlchemy's per-row
processing). Smaller batches use INSERT, whose fixed cost is lower."""

_COLUMNS = (
    "run_id",
    "entity",
    "to_state",
    "from_state",
    "actor",
    "step_id",
    "step",
    "attempt",
    "reason",
    "detail",
    "published",
)


class StepRow(Protocol):
    """What a step event needs of a step row: its run, id and name."""

    @property
    def run_id(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...


CANCEL_AGENT_KEY = "agent"
"""The detail key of a step's `cancelled` event (from `processing`) naming the agent that holds
the attempt: the relay sends that agent a `Cancel` (sasflow.ops.cancel, sasflow.relay)."""


def step_event(
    row: StepRow,
    from_state: StepState | None,
    to_state: StepState,
    *,
    actor: str,
    reason: str | None = None,
    attempt: int | None = None,
    detail: Any = None,
) -> Event:
    """The event of one step's change, from a row holding its run id, id and name."""
    return Event(
        run_id=row.run_id,
        entity="step",
        step_id=row.id,
        step=row.name,
        from_state=from_state,
        to_state=to_state,
        attempt=attempt,
        actor=actor,
        reason=reason,
        detail=detail,
    )


UNKNOWN_WORKFLOW = "unknown"
"""The workflow `finished_runs` reports for an ending event that did not name one."""


def finished_runs(batch: Sequence[Event]) -> dict[int, FinishedRun]:
    """The runs that `batch` takes to a terminal state: run id -> its state and workflow."""
    return {
        e.run_id: FinishedRun(RunState(e.to_state), e.workflow or UNKNOWN_WORKFLOW)
        for e in batch
        if e.entity == "run" and e.run_id is not None and e.to_state in TERMINAL_RUN_STATES
    }


def record(
    conn: Connection, batch: Sequence[Event], *, with_callback: Collection[int] | None = None
) -> None:
    """Append `batch` in the caller's transaction: one COPY on PostgreSQL for a large batch,
    else one executemany.

    Every run that this batch makes terminal gets its HTTP callback (if it asked for one)
    written in the same transaction: all the paths that end runs (advance, sweep, cancel)
    record their events here, so this is the one place callbacks cannot be missed.
    `with_callback`: the runs known to have asked for one, when the caller read them (under
    their locks) anyway; the others are not looked up again."""
    if not batch:
        return
    if len(batch) >= COPY_FROM and capabilities(conn).copy_events:
        _copy(conn, batch)
    else:
        conn.execute(insert(events), [e.row() for e in batch])
    ended = finished_runs(batch)
    if with_callback is not None:
        ended = {run_id: state for run_id, state in ended.items() if run_id in with_callback}
    if ended:
        callbacks.enqueue(conn, sorted(ended))


def _copy(conn: Connection, batch: Sequence[Event]) -> None:
    """COPY through the transaction's own psycopg connection. `detail` is JSON text, the form
    SQLAlchemy's JSON type would send (json.dumps); None is SQL NULL in every column, as with
    INSERT (the JSON type is declared none_as_null)."""
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    statement = f"COPY {events.name} ({', '.join(_COLUMNS)}) FROM STDIN"
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for event in batch:
                row = event.row()
                if row["detail"] is not None:
                    row["detail"] = json.dumps(row["detail"])
                copy.write_row([row[column] for column in _COLUMNS])
    except psycopg.Error as exc:
        raise driver_error(statement, exc) from exc


def driver_error(statement: str, exc: psycopg.Error) -> Exception:
    """The SQLAlchemy exception that SQLAlchemy itself raises for this driver error (it did
    not run the COPY, so it could not wrap it): callers and `db.translated` then treat the COPY
    path as the INSERT path (a lost connection is StoreUnavailableError, a deadlock a
    ConflictError to retry, a foreign key violation an IntegrityError)."""
    return DBAPIError.instance(statement, None, exc, psycopg.Error)


@dataclass(frozen=True)
class Taken:
    """What one relay pass took: the events it publishes, and whether it held any back."""

    rows: Sequence[Row[Any]]
    held_back: bool
    """Events were left because another relay holds an earlier event of their run: they stay
    locked by this pass's transaction until it ends, and only then can a relay take them, so
    the relay that left them takes them again soon after (sasflow.relay.Relay.held_back)."""


def take_unpublished(conn: Connection, *, limit: int) -> Taken:
    """The oldest events not yet published, with their run's key, workflow and reply_to,
    locked for this relay until its transaction ends (queries.unpublished_events).

    Left out: the events of a run whose first unpublished event is not among them (another
    relay holds it, waiting for its confirms): publishing them now would put a run's later
    states before its earlier ones, on the status exchange and on the subscription stream.
    They stay unpublished (locked by this transaction until it ends) for a later pass: the
    answer's `held_back`."""
    rows = conn.execute(queries.unpublished_events(), {"b_limit": limit}).all()
    taken = {row.id for row in rows}
    kept = [r for r in rows if r.first_unpublished is None or r.first_unpublished in taken]
    return Taken(kept, held_back=len(kept) < len(rows))


def mark_published(conn: Connection, event_ids: Sequence[int]) -> None:
    """Mark relayed events (queries.mark_published)."""
    conn.execute(queries.mark_published(), {"b_event_ids": list(event_ids)})
