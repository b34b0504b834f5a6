"""Claim ready steps for dispatch, and give them back when they could not be dispatched."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from sasflow.states import RunState, StepState
from sasflow.store.dialect import capabilities
from sasflow.store.runs import events, queries


@dataclass(frozen=True)
class ClaimedStep:
    """A step this scheduler now holds (`processing`, `locked_by` = us, attempt incremented)."""

    id: int
    run_id: int
    workflow: str
    name: str
    kind: str
    agent: str
    action: str
    attempt: int
    input: Any
    idempotency_key: str
    timeout_s: float
    complete_by: datetime
    priority: int
    pool: str | None = None
    """The agent pool that must run it (None: the agent's shared queue)."""
    wait_timeout_s: float = 30.0
    """How long its request may wait for an agent (the request's `wait_ms` and expiration)."""
    heartbeat_timeout_s: float | None = None
    wait_expiries: int = 0
    """Times in a row no agent took its request within the wait timeout (docs/timeouts.md)."""
    map_index: int | None = None
    """An item of a map step: its index, and how many items the map has; None otherwise."""
    map_size: int | None = None


def claim_steps(
    conn: Connection, *, locked_by: str, batch: int, skip_agents: Sequence[str] = ()
) -> list[ClaimedStep]:
    """Claim up to `batch` ready steps in one statement, in priority order, none of the agents
    in `skip_agents`; record the dispatch. The steps come in `claim_order`."""
    return claim(conn, locked_by=locked_by, batch=batch, skip_agents=skip_agents)[0]


def claim(
    conn: Connection,
    *,
    locked_by: str,
    batch: int,
    skip_agents: Sequence[str] = (),
    only_agents: Sequence[str] = (),
    at: datetime | None = None,
    learn_due: bool = True,
) -> tuple[list[ClaimedStep], float | None]:
    """`claim_steps`, and when the batch is not full `seconds_until_due` (from the claim's own
    rows when it found work, else with a second statement). `only_agents`: the steps of these
    agents alone, claimed `at` that database time (the budgeted claim's, store/flow/claim.py);
    `learn_due` False: no second statement when it finds nothing (the due is None then)."""
    values: dict[str, Any] = {"b_batch": batch, "b_locked_by": locked_by}
    skipping = bool(skip_agents)
    if skipping:
        values["b_skip_agents"] = list(skip_agents)
    if only_agents:
        values["b_only_agents"] = list(only_agents)
        values["b_at"] = at
    rows = _claim_rows(conn, values, skipping=skipping, chosen=False, only=bool(only_agents))
    if not rows:
        return [], seconds_until_due(conn) if learn_due else None
    due = None if len(rows) == batch else _remaining(rows[0].due, rows[0].db_now)
    return _record(conn, rows, locked_by), due


def claim_chosen(
    conn: Connection, step_ids: Sequence[int], *, locked_by: str, at: datetime
) -> tuple[list[ClaimedStep], float | None]:
    """Claim the steps `step_ids`, which this transaction chose and locked (the budgeted claim,
    store/flow/claim.py), exactly as `claim` claims but `at` the database time its rates
    admitted them; and, when it claimed some, the seconds until the earliest backoff ends (as
    `claim`'s rows give them)."""
    values = {"b_step_ids": list(step_ids), "b_locked_by": locked_by, "b_at": at}
    rows = _claim_rows(conn, values, skipping=False, chosen=True)
    if not rows:
        return [], None
    return _record(conn, rows, locked_by), _remaining(rows[0].due, rows[0].db_now)


def _claim_rows(
    conn: Connection, values: dict[str, Any], *, skipping: bool, chosen: bool, only: bool = False
) -> Sequence[Any]:
    if capabilities(conn).merged_claim:
        statement: Any = queries.claim_and_start(skipping=skipping, chosen=chosen, only=only)
    else:
        statement = queries.claim_ready(skipping=skipping, chosen=chosen, only=only)
    # UPDATE ... RETURNING gives its rows in no defined order (PostgreSQL's and SQLite's
    # differ): a claim answers in CLAIM_ORDER on every database.
    return sorted(conn.execute(statement, values).all(), key=claim_order)


def claim_order(row: Any) -> tuple[int, int]:
    """The order of a claim's steps, on every database: highest priority first, then by id
    (the order they were recorded in)."""
    return (-row.priority, row.id)


def _record(conn: Connection, rows: Sequence[Any], locked_by: str) -> list[ClaimedStep]:
    """The claimed rows as ClaimedSteps, their runs started and both recorded (the portable
    path; the merged statement did it already)."""
    claimed = [
        ClaimedStep(
            id=r.id,
            run_id=r.run_id,
            workflow=r.workflow,
            name=r.name,
            kind=r.kind,
            agent=r.agent,
            action=r.action,
            attempt=r.attempt,
            input=r.input,
            idempotency_key=r.idempotency_key,
            timeout_s=r.timeout_s,
            complete_by=r.complete_by,
            priority=r.priority,
            pool=r.pool,
            wait_timeout_s=r.wait_timeout_s,
            heartbeat_timeout_s=r.heartbeat_timeout_s,
            wait_expiries=r.wait_expiries,
            map_index=r.map_index,
            map_size=r.map_size,
        )
        for r in rows
    ]
    if not capabilities(conn).merged_claim:
        _start_and_record(conn, claimed, locked_by)
    return claimed


def _start_and_record(conn: Connection, claimed: Sequence[ClaimedStep], locked_by: str) -> None:
    """What `queries.claim_and_start` does besides claiming, on the portable path (SQLite has
    no data-modifying CTEs)."""
    started = (
        conn.execute(queries.start_runs(), {"b_run_ids": sorted({c.run_id for c in claimed})})
        .scalars()
        .all()
    )
    batch_events = [
        events.Event(
            run_id=run_id,
            entity="run",
            from_state=RunState.PENDING,
            to_state=RunState.RUNNING,
            actor=locked_by,
        )
        for run_id in started
    ]
    batch_events += [
        events.step_event(
            c,
            StepState.PENDING,
            StepState.PROCESSING,
            attempt=c.attempt,
            actor=locked_by,
            detail={"agent": c.agent, "action": c.action},
        )
        for c in sorted(claimed, key=lambda c: c.id)  # by id, as queries.claim_and_start
    ]
    events.record(conn, batch_events)


def in_flight(conn: Connection, *, locked_by: str) -> dict[str, int]:
    """Agent -> steps `locked_by` has in flight (claimed, no outcome applied yet)."""
    rows = conn.execute(queries.in_flight_by_agent(), {"b_locked_by": locked_by}).all()
    return {r.agent: int(r.n) for r in rows}


def seconds_until_due(conn: Connection) -> float | None:
    """Seconds, on the database's clock, until the earliest step backing off (after a failure,
    a deferral or a supervisor's reclaim) becomes ready; None if no step is backing off."""
    row = conn.execute(queries.next_due()).one()
    return _remaining(row.due, row.now)


def _remaining(due: datetime | None, db_now: datetime) -> float | None:
    if due is None:
        return None
    return max(0.0, (due - db_now).total_seconds())


def release_steps(
    conn: Connection, steps: Sequence[ClaimedStep], *, locked_by: str, reason: str
) -> int:
    """Make claimed steps pending again (their requests never reached the broker)."""
    if not steps:
        return 0
    rows = conn.execute(
        queries.release_claimed(), {"b_step_ids": [s.id for s in steps], "b_locked_by": locked_by}
    ).all()
    record_handed_back(conn, rows, actor=locked_by, reasons=[reason] * len(rows))
    return len(rows)


def record_handed_back(
    conn: Connection,
    rows: Sequence[Any],
    *,
    actor: str,
    reasons: Sequence[str],
    attempt_undone: bool = False,
) -> None:
    """Record claimed steps going back to pending (rows: run_id, id, name, attempt), each with
    its reason; with `attempt_undone` the rows hold the attempt before the claim."""
    events.record(
        conn,
        [
            events.step_event(
                r,
                StepState.PROCESSING,
                StepState.PENDING,
                attempt=r.attempt + 1 if attempt_undone else r.attempt,
                actor=actor,
                reason=reason,
            )
            for r, reason in zip(rows, reasons, strict=True)
        ],
    )
