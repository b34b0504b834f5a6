"""Approvals (`Step.approval`) in the store: the open ones listed, one read and locked for a
decision, the decision applied (fenced: only an open approval changes, once), and the overdue
ones escalated with one `approval_overdue` alert each (`steps.escalate_at`, cleared as the
alert is raised, so an approval escalates once whatever the alert becomes).

An approval is an event wait (agent `sasflow.event`) on the reserved event
`approvals.APPROVAL_EVENT`: its open row is in the event waits' indexes, its timeout is theirs
(store.inbound.match.time_out)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update

from sasflow.approvals import APPROVAL_EVENT
from sasflow.states import ACTIVE_RUN_STATES, StepKind, StepState
from sasflow.store.outbox.alerts import Alert, AlertKind, raise_alert, resolve_open
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now
from sasflow.waits import EVENT_AGENT

_open = (
    steps.c.state == StepState.PENDING,
    steps.c.agent == EVENT_AGENT,
    steps.c.action == APPROVAL_EVENT,
)
_COLUMNS = (
    steps.c.id,
    steps.c.run_id,
    steps.c.name,
    steps.c.state,
    steps.c.agent,
    steps.c.action,
    steps.c.input,
    steps.c.output,
    steps.c.park_errors,
    steps.c.not_before.label("times_out_at"),
    steps.c.updated_at.label("opened_at"),
    steps.c.escalate_at,
    runs.c.workflow,
    runs.c.version,
    runs.c.business_key,
    runs.c.state.label("run_state"),
)


def open_approvals(
    conn: Connection,
    *,
    workflow: str | None = None,
    group: str | None = None,
    run_id: int | None = None,
    limit: int = 100,
) -> list[Any]:
    """Open approvals of active runs, oldest first, of `workflow`, of approvers' `group` (read
    from the step's input, before the limit), of run `run_id` (ix_steps_event_waits: action,
    then the run's id as correlation)."""
    query = (
        select(*_COLUMNS)
        .join(runs, runs.c.id == steps.c.run_id)
        .where(*_open, runs.c.state.in_(ACTIVE_RUN_STATES))
        .order_by(steps.c.updated_at, steps.c.id)
        .limit(limit)
    )
    if workflow is not None:
        query = query.where(runs.c.workflow == workflow)
    if group is not None:
        query = query.where(steps.c.input["approval"]["group"].as_string() == group)
    if run_id is not None:
        query = query.where(steps.c.correlation == str(run_id), steps.c.run_id == run_id)
    return list(conn.execute(query).all())


def approval_step(conn: Connection, run_id: int, name: str) -> Any:
    """The forward step `name` of run `run_id` with its run's facts, locked until commit, or
    None (its unique key)."""
    return conn.execute(
        select(*_COLUMNS)
        .join(runs, runs.c.id == steps.c.run_id)
        .where(steps.c.run_id == run_id, steps.c.kind == StepKind.FORWARD, steps.c.name == name)
        .with_for_update(of=steps)
    ).first()


def decide(
    conn: Connection, step_id: int, state: StepState, *, output: Any = None, error: Any = None
) -> Any:
    """Fenced: the open approval `step_id` becomes `state` (processed, error or parked) with
    `output` or `error`; its row (id, run_id, name), or None when it is not open (primary
    key)."""
    return conn.execute(
        update(steps)
        .where(steps.c.id == step_id, *_open)
        .values(
            state=state,
            output=output,
            error=error,
            correlation=None,
            escalate_at=None,
            updated_at=now(),
        )
        .returning(steps.c.id, steps.c.run_id, steps.c.name)
    ).one_or_none()


def escalate(conn: Connection, *, batch: int, actor: str) -> int:
    """Raise one `approval_overdue` alert per open approval past its `escalate_at` (up to
    `batch`, earliest first), and clear the mark of those and of any other step past it (an
    approval its run's end closed); how many alerts (ix_steps_escalations)."""
    due = conn.execute(
        select(*_COLUMNS)
        .join(runs, runs.c.id == steps.c.run_id)
        .where(steps.c.escalate_at <= now())
        .order_by(steps.c.escalate_at, steps.c.id)
        .limit(batch)
        .with_for_update(of=steps, skip_locked=True)
    ).all()
    if not due:
        return 0
    conn.execute(
        update(steps)
        .where(steps.c.id.in_(bindparam("b_ids", expanding=True)))
        .values(escalate_at=None),
        {"b_ids": [r.id for r in due]},
    )
    raised = 0
    for row in due:
        if row.state != StepState.PENDING or row.run_state not in ACTIVE_RUN_STATES:
            continue
        if raise_alert(conn, overdue_alert(row, actor=actor)) is not None:
            raised += 1
    return raised


def overdue_alert(row: Any, *, actor: str) -> Alert:
    """The `approval_overdue` alert of an open approval (a row of `escalate`)."""
    approval = (row.input or {}).get("approval", {})
    scope = approval.get("scope", "approve")
    message = (
        f"run {row.run_id} of {row.workflow} (key {row.business_key}): approval {row.name!r} "
        f"has waited {approval.get('escalate_after_s')} s for a decision (scope {scope!r})"
    )
    return Alert(
        AlertKind.APPROVAL_OVERDUE,
        str(row.id),
        message,
        run_id=row.run_id,
        step_id=row.id,
        detail={"step": row.name, "scope": scope, "reported_by": actor},
        workflow=row.workflow,
    )


def resolve_overdue(conn: Connection, step_id: int, *, actor: str, reason: str) -> bool:
    """Close the approval's `approval_overdue` alert (it was decided); False when none was
    open."""
    key = Alert(AlertKind.APPROVAL_OVERDUE, str(step_id), "").dedup_key
    return resolve_open(conn, key, actor=actor, reason=reason)


def next_escalation(conn: Connection) -> float | None:
    """Seconds, on the database clock, until the earliest approval becomes overdue (0.0: one
    is now); None when none will (ix_steps_escalations)."""
    row = conn.execute(
        select(func.min(steps.c.escalate_at).label("due"), now().label("now")).where(
            steps.c.escalate_at.is_not(None)
        )
    ).one()
    if row.due is None:
        return None
    remaining: float = (row.due - row.now).total_seconds()
    return max(0.0, remaining)
