"""Apply a batch of step outcomes in one transaction, each fenced by its step's attempt."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row

from sasflow.commands import FinishedRun, StepOutcome, StoredError
from sasflow.registry import Registry
from sasflow.states import ReplyStatus, StepState
from sasflow.store.dialect import capabilities
from sasflow.store.notify import notify_ready
from sasflow.store.runs import events, queries
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.parked import raise_parked_alerts

log = logging.getLogger(__name__)

GAVE_UP = StoredError("GaveUp", "dependency unavailable past the step's give-up age")


@dataclass
class ApplyReport:
    """How many outcomes were applied, and which were dropped (stale or duplicate)."""

    applied: int = 0
    dropped: list[StepOutcome] = field(default_factory=list)
    ready: int = 0
    backing_off: int = 0
    """Steps back to pending after a counted failure or a deferral, ready after a backoff."""
    finished: dict[int, FinishedRun] = field(default_factory=dict)
    """Runs that reached a terminal state: run id -> its state and workflow."""
    parked: int = 0
    """Steps parked (their policy parks them rather than failing their run)."""
    deferred: int = 0
    """Runs left to the schedulers' advance duty (user code to run, or a version to find)."""


def apply_outcomes(
    conn: Connection,
    registry: Registry,
    outcomes: Sequence[StepOutcome],
    *,
    namespace: str,
    actor: str,
) -> ApplyReport:
    """Apply `outcomes` inside the caller's transaction; the caller commits, then acks."""
    report = ApplyReport()
    if not outcomes:
        return report
    locked = conn.execute(
        queries.lock_runs_of_steps(), {"b_step_ids": sorted({o.step_id for o in outcomes})}
    ).all()
    batch: list[events.Event] = []
    changed: list[Row[Any]] = []
    parked: set[int] = set()
    completed = _complete_together(conn, outcomes)
    for outcome in outcomes:
        fence = {"b_step_id": outcome.step_id, "b_attempt": outcome.attempt}
        error = outcome.error.to_json() if outcome.error else None
        if outcome.step_id in completed:  # only `ok` outcomes, one per step
            row = completed.pop(outcome.step_id)
            to_state = StepState.PROCESSED
        elif outcome.kind is ReplyStatus.OK:
            values = {**fence, "b_output": outcome.output}
            row = conn.execute(queries.complete_step(), values).first()
            to_state = StepState.PROCESSED
        elif outcome.kind is ReplyStatus.ERROR:
            row = conn.execute(queries.fail_step(), {**fence, "b_error": error}).first()
            to_state = StepState(row.state) if row is not None else StepState.ERROR
        elif outcome.kind is ReplyStatus.FAILED:
            row = conn.execute(queries.count_failure(), {**fence, "b_error": error}).first()
            to_state = StepState(row.state) if row is not None else StepState.PENDING
        else:
            row = conn.execute(
                queries.defer_step(),
                {**fence, "b_defer_seconds": outcome.defer_seconds, "b_error": error},
            ).first()
            to_state = StepState.PENDING
            if row is None:
                # Past its give-up age (or stale): an open breaker now counts as a failure.
                failure = conn.execute(
                    queries.count_failure(), {**fence, "b_error": GAVE_UP.to_json()}
                ).first()
                if failure is not None:
                    row, to_state = failure, StepState(failure.state)
        if row is None:
            log.info(
                "dropped stale or duplicate reply for step %s attempt %s (%s)",
                outcome.step_id,
                outcome.attempt,
                outcome.kind,
            )
            report.dropped.append(outcome)
            continue
        report.applied += 1
        report.backing_off += to_state == StepState.PENDING
        if to_state == StepState.PARKED:
            parked.add(outcome.step_id)
        changed.append(row)
        batch.append(
            events.Event(
                run_id=row.run_id,
                entity="step",
                step_id=outcome.step_id,
                step=row.name,
                from_state=StepState.PROCESSING,
                to_state=to_state,
                attempt=outcome.attempt,
                actor=actor,
                reason=outcome.kind if outcome.kind is not ReplyStatus.OK else None,
                detail=_detail(error, outcome.agent, row, to_state),
            )
        )
    advanced = advance_runs(
        conn,
        registry,
        {row.run_id for row in changed},
        actor=actor,
        locked=locked,
        map_items=_map_items(changed),
    )
    batch.extend(advanced.events)
    report.parked = len(parked)
    raise_parked_alerts(conn, parked, actor=actor)
    # Every run that can end here is in `locked` (read with its callback_url).
    events.record(conn, batch, with_callback={r.id for r in locked if r.callback_url})
    report.ready = advanced.ready
    report.deferred = advanced.deferred
    report.finished = events.finished_runs(advanced.events)
    if advanced.ready:
        notify_ready(conn, namespace)
    return report


def _map_items(changed: Sequence[Row[Any]]) -> dict[int, frozenset[int]]:
    """Run id -> the maps whose items these changed steps are, for the runs where only items
    of maps changed (store.runs.map_drain releases their next items without reading the run)."""
    maps: dict[int, set[int]] = {}
    whole: set[int] = set()
    for row in changed:
        if row.map_parent is None:
            whole.add(row.run_id)
        else:
            maps.setdefault(row.run_id, set()).add(row.map_parent)
    return {run: frozenset(ids) for run, ids in maps.items() if run not in whole}


def _complete_together(
    conn: Connection, outcomes: Sequence[StepOutcome]
) -> dict[int, Row[Any] | None]:
    """Where the database can (`Capabilities.batched_complete`), apply the `ok` outcomes of a
    batch with one statement (queries.complete_steps): step id -> its row, or None when the
    fence dropped it. Only the steps with one outcome in the batch: a step's duplicates are
    applied one by one, in order, as before. Empty when there is nothing to gain (one
    outcome) or on the portable path."""
    if len(outcomes) < 2 or not capabilities(conn).batched_complete:
        return {}
    counts = Counter(o.step_id for o in outcomes)
    ok = [o for o in outcomes if o.kind is ReplyStatus.OK and counts[o.step_id] == 1]
    if len(ok) < 2:
        return {}
    rows = conn.execute(
        queries.complete_steps(),
        {
            "b_step_ids": [o.step_id for o in ok],
            "b_attempts": [o.attempt for o in ok],
            "b_outputs": [None if o.output is None else json.dumps(o.output) for o in ok],
        },
    ).all()
    applied = {r.id: r for r in rows}
    return {o.step_id: applied.get(o.step_id) for o in ok}


def fail_step(
    conn: Connection,
    registry: Registry,
    step_id: int,
    attempt: int,
    error: StoredError,
    *,
    namespace: str,
    actor: str,
    agent: str | None = None,
) -> ApplyReport:
    """Fail attempt `attempt` of a step for good (fenced like an agent's error), e.g. when its
    request cannot be dispatched or its reply cannot be stored."""
    failure = StepOutcome(
        step_id=step_id, attempt=attempt, kind=ReplyStatus.ERROR, error=error, agent=agent
    )
    return apply_outcomes(conn, registry, [failure], namespace=namespace, actor=actor)


def _detail(error: Any, agent: str | None, row: Any, to_state: StepState) -> Any:
    """The event's detail: the agent's error, and when the step is ready again after a
    counted failure or a deferral (`not_before`, what the console's timeline draws as the
    backoff)."""
    if not error:
        return None
    found: dict[str, Any] = {"error": error, "agent": agent}
    if to_state == StepState.PENDING:
        found["not_before"] = row.not_before.isoformat()
    return found
