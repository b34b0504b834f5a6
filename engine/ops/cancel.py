"""Operator cancellation: stop a run; optionally undo what it did.

Without compensation: pending and waiting steps are cancelled, and so are steps in flight, so
their late replies are fenced out; the run ends `cancelled`. With compensation: steps not yet
started are cancelled, steps in flight are left to finish (they may succeed, and must then be
undone), and the run goes `compensating`: the compensating actions of its processed steps run
in reverse order once nothing is in flight.

A step cancelled in flight ends `cancelled` here, in the cancel's transaction: its event (from
`processing`, with the attempt and, in its detail, the agent) is the durable intent the relay
publishes as a `Cancel` to the agent holding it (sasflow.relay, docs/protocol.md), so the
agent's handler is told and its programs stopped, whichever face cancelled and even when the
broker was down at the time. Whatever the agent then does, its reply is fenced out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sasflow.commands import StoredError
from sasflow.errors import InvalidActionError
from sasflow.ops.actions import close_alerts, lock_run
from sasflow.ops.reasons import REASON_MAX
from sasflow.states import CANCELLABLE_RUN_STATES, NOT_STARTED_STEP_STATES, RunState, StepState
from sasflow.store.db import Connection, rehearse
from sasflow.store.notify import notify_ready
from sasflow.store.operator import inspect
from sasflow.store.operator import transitions as operator
from sasflow.store.operator.inspect import RunFilter
from sasflow.store.runs import children, events
from sasflow.store.runs.advance import advance_runs
from sasflow.store.runs.events import CANCEL_AGENT_KEY


@dataclass(frozen=True)
class Cancelled:
    run_id: int
    state: str
    cancelled_steps: tuple[str, ...]


def cancel(
    conn: Connection,
    run_id: int,
    *,
    actor: str,
    reason: str,
    namespace: str,
    compensate: bool = False,
) -> Cancelled:
    """Cancel one run inside the caller's transaction (see the module docstring)."""
    run = lock_run(conn, run_id)
    if run.state not in CANCELLABLE_RUN_STATES:
        raise InvalidActionError(
            f"run {run_id} is {run.state}: only pending or running runs can be cancelled"
        )
    stop_states = (
        NOT_STARTED_STEP_STATES if compensate else NOT_STARTED_STEP_STATES | {StepState.PROCESSING}
    )
    candidates = operator.lock_steps_in(conn, run_id, stop_states)
    # To compensate, an earlier attempt with an unknown outcome must be known first: retried.
    stopped = [
        s for s in candidates if not (compensate and s.state == StepState.PENDING and s.attempt > 0)
    ]
    operator.cancel_steps(conn, [s.id for s in stopped])
    stored = StoredError("Cancelled", reason, {"by": actor}).to_json()
    to_state = operator.cancel_run(conn, run_id, compensate=compensate, error=stored)
    batch = [
        events.Event(
            run_id=run_id,
            entity="run",
            from_state=run.state,
            to_state=to_state,
            actor=actor,
            reason=f"cancelled: {reason}",
            workflow=run.workflow,
        )
    ]
    batch += [_cancelled_event(s, actor=actor, reason=reason) for s in stopped]
    final: str = to_state
    if compensate:
        advanced = advance_runs(conn, None, [run_id], actor=actor)
        batch += advanced.events
        final = operator.run_state(conn, run_id)
        notify_ready(conn, namespace)
    if not compensate:  # a child's parent step fails with it (compensating: when it ends)
        parent, ended = children.ended(
            conn, run_id, run.workflow, RunState.CANCELLED, None, stored, actor=actor
        )
        batch += ended
        if parent is not None:
            batch += advance_runs(conn, None, [parent], actor=actor).events
    events.record(conn, batch)
    close_alerts(conn, run_id, actor=actor, reason=f"run cancelled: {reason}")
    # Its children still pending or running are cancelled the same way, recursively (their
    # agents get their cancel); the parent's step that waited for each is cancelled already.
    for child in children.active_children(conn, run_id):
        cancel(
            conn,
            child,
            actor=actor,
            reason=f"parent run {run_id} cancelled: {reason}"[:REASON_MAX],
            namespace=namespace,
            compensate=compensate,
        )
    return Cancelled(run_id, final, tuple(s.name for s in stopped))


def _cancelled_event(step: Any, *, actor: str, reason: str) -> events.Event:
    """A step's `cancelled` event; one cancelled in flight names its attempt and its agent,
    which the relay turns into the agent's `Cancel`."""
    in_flight = step.state == StepState.PROCESSING
    return events.step_event(
        step,
        step.state,
        StepState.CANCELLED,
        actor=actor,
        reason=f"cancelled: {reason}",
        attempt=step.attempt if in_flight else None,
        detail={CANCEL_AGENT_KEY: step.agent} if in_flight else None,
    )


def cancel_many(
    conn: Connection,
    where: RunFilter,
    *,
    actor: str,
    reason: str,
    namespace: str,
    compensate: bool,
    dry_run: bool,
) -> list[Cancelled]:
    """Cancel every pending or running run `where` selects, oldest first (its other states
    select nothing); with `dry_run` the same cancellations are made and rolled back, so the
    preview names exactly the runs and steps the real action stops. A run that ended between
    the selection and its lock is left out, not an error."""
    states = tuple(s for s in where.states or CANCELLABLE_RUN_STATES if s in CANCELLABLE_RUN_STATES)
    if not states:
        return []
    chosen = dataclasses.replace(where, states=states)

    def one(conn: Connection, run_id: int) -> Cancelled | None:
        try:
            return cancel(
                conn,
                run_id,
                actor=actor,
                reason=reason,
                namespace=namespace,
                compensate=compensate,
            )
        except InvalidActionError:  # refused before it wrote anything: it just ended
            return None

    def work(conn: Connection) -> list[Cancelled]:
        done = (one(conn, run_id) for run_id in inspect.select_run_ids(conn, chosen))
        return [c for c in done if c is not None]

    return rehearse(conn, work) if dry_run else work(conn)
