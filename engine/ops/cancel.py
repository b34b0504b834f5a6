"""Operator cancellation: stop a run; optionally undo what it did.

Without compensation: pending and waiting steps are cancelled, and so are steps in flight, so
their late replies are fenced out; the run ends `cancelled`. With compensation: steps not yet
started are cancelled, steps in flight are left to finish (they may succeed, and must then be
undone), and the run goes `compensating`: the compensating actions of its processed steps run
in reverse order once nothing is in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, select, update

from sasflow.ops.actions import InvalidActionError, close_alerts, lock_run
from sasflow.store import events
from sasflow.store.advance import advance_runs
from sasflow.store.notify import notify_ready
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now

CANCELLABLE = frozenset({"pending", "running"})


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
    compensate: bool = False,
    namespace: str = "sasflow",
) -> Cancelled:
    run = lock_run(conn, run_id)
    if run.state not in CANCELLABLE:
        raise InvalidActionError(
            f"run {run_id} is {run.state}: only pending or running runs can be cancelled"
        )
    stop_states = ("waiting", "pending") if compensate else ("waiting", "pending", "processing")
    candidates = conn.execute(
        select(steps.c.id, steps.c.name, steps.c.state, steps.c.attempt)
        .where(steps.c.run_id == run_id, steps.c.state.in_(stop_states))
        .with_for_update()
    ).all()
    # To compensate, an earlier attempt with an unknown outcome must be known first: retried.
    stopped = [s for s in candidates if not (compensate and s.state == "pending" and s.attempt > 0)]
    if stopped:
        conn.execute(
            update(steps)
            .where(steps.c.id.in_([s.id for s in stopped]))
            .values(state="cancelled", locked_by=None, complete_by=None, updated_at=now())
        )
    to_state = "compensating" if compensate else "cancelled"
    values: dict[str, object] = {
        "state": to_state,
        "updated_at": now(),
        "error": {"type": "Cancelled", "message": reason, "by": actor},
    }
    if not compensate:
        values["finished_at"] = now()
    conn.execute(update(runs).where(runs.c.id == run_id).values(**values))
    batch = [
        events.Event(
            run_id=run_id,
            entity="run",
            from_state=run.state,
            to_state=to_state,
            actor=actor,
            reason=f"cancelled: {reason}",
        )
    ]
    batch += [
        events.Event(
            run_id=run_id,
            entity="step",
            step_id=s.id,
            step=s.name,
            from_state=s.state,
            to_state="cancelled",
            actor=actor,
            reason=f"cancelled: {reason}",
        )
        for s in stopped
    ]
    final = to_state
    if compensate:
        advanced = advance_runs(conn, None, [run_id], actor=actor)
        batch += advanced.events
        final = conn.execute(select(runs.c.state).where(runs.c.id == run_id)).scalar_one()
        notify_ready(conn, namespace)
    events.record(conn, batch)
    close_alerts(conn, run_id, actor=actor, reason=f"run cancelled: {reason}")
    return Cancelled(run_id, final, tuple(s.name for s in stopped))
