"""Operator unpark and fail of parked steps (docs/operations.md "Parked steps").

A step whose policy parks it (`on_exhausted="park"`, `on_error="park"`) goes `parked` when its
failures run out or its agent answers a permanent error, with a `step_parked` alert; its run
keeps its state and waits. An operator then either unparks the run (after fixing the partner):
its parked steps are pending again with a fresh failure budget and the schedulers are woken;
or fails it: its parked steps go to `error` and the run ends as it would have without parking
(error and a `step_failed` alert, or compensation per its `on_failure`). Either resolves the
steps' `step_parked` alerts and is an event of each step in the run's timeline, with the actor
and the reason (like pausing a run).
"""

from __future__ import annotations

from typing import Any

from sasflow.errors import InvalidActionError
from sasflow.ops.actions import lock_run
from sasflow.ops.reasons import REASON_MAX, has_text
from sasflow.states import ACTIVE_RUN_STATES, StepState
from sasflow.store.db import Connection
from sasflow.store.notify import notify_ready
from sasflow.store.operator import parking
from sasflow.store.operator import transitions as operator
from sasflow.store.runs import events
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.parked import parked_steps, resolve_parked_alert


def _check_reason(reason: str) -> None:
    if not has_text(reason) or len(reason) > REASON_MAX:
        raise InvalidActionError(
            f"unparking or failing a run needs a reason with text (1 to {REASON_MAX} characters)"
        )


def unpark_run(
    conn: Connection, run_id: int, *, actor: str, reason: str, namespace: str
) -> dict[str, Any]:
    """Unpark the run's parked steps inside the caller's transaction: {run_id, state, steps
    (the names unparked), changed}. A run with no parked step changes nothing and records
    nothing (`changed` False), like resuming a run not paused."""
    _check_reason(reason)
    run = lock_run(conn, run_id)
    found = parked_steps(conn, run_id, lock=True)
    rows = parking.unpark_steps(conn, [s.id for s in found])
    if rows:
        events.record(
            conn,
            [
                events.step_event(
                    r,
                    StepState.PARKED,
                    StepState.PENDING,
                    actor=actor,
                    reason=f"unparked: {reason}",
                    detail={"failure_count": 0},
                )
                for r in rows
            ],
        )
        _resolve(conn, rows, actor=actor, reason=f"unparked: {reason}")
        notify_ready(conn, namespace)
    return {
        "run_id": run_id,
        "state": str(run.state),
        "steps": [r.name for r in rows],
        "changed": bool(rows),
    }


def fail_run(
    conn: Connection, run_id: int, *, actor: str, reason: str, namespace: str
) -> dict[str, Any]:
    """Fail the run's parked steps inside the caller's transaction, and the run with them as
    its failure policy says (error and an alert, or compensation): {run_id, state (the run's
    after it), steps (the names failed), changed (True)}. A run with no parked step is refused:
    only a parked run is failed this way (cancel ends any run)."""
    _check_reason(reason)
    run = lock_run(conn, run_id)
    found = parked_steps(conn, run_id, lock=True)
    if run.state not in ACTIVE_RUN_STATES or not found:
        raise InvalidActionError(f"run {run_id} ({run.state}) has no parked step to fail")
    rows = parking.fail_steps(conn, [s.id for s in found])
    batch = [
        events.step_event(
            r, StepState.PARKED, StepState.ERROR, actor=actor, reason=f"failed: {reason}"
        )
        for r in rows
    ]
    advanced = advance_runs(conn, None, [run_id], actor=actor)
    batch += advanced.events
    events.record(conn, batch)
    _resolve(conn, rows, actor=actor, reason=f"failed: {reason}")
    if advanced.ready or advanced.compensations:
        notify_ready(conn, namespace)
    return {
        "run_id": run_id,
        "state": operator.run_state(conn, run_id),
        "steps": [r.name for r in rows],
        "changed": True,
    }


def _resolve(conn: Connection, rows: Any, *, actor: str, reason: str) -> None:
    """Close the `step_parked` alerts of the steps `rows`: an operator acted on them."""
    for row in rows:
        resolve_parked_alert(conn, row.id, actor=actor, reason=reason)
