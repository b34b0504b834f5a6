"""The statements of operator actions (sasflow.ops): lock a run, cancel it, resubmit it, close
its alerts.

`sasflow.ops` decides what an action does and records it (events with actor and reason); the
statements that carry it out are here. The caller locks the run (`lock_run`) before any other
statement of the action, so schedulers, the supervisor and other operators wait for it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, delete, select, update

from sasflow.states import RunState, StepKind, StepState
from sasflow.store.outbox.incidents import close_if_done
from sasflow.store.runs import advance_queries
from sasflow.store.runs.queries import leave_processing
from sasflow.store.schema import alerts, runs, steps
from sasflow.store.sqltime import now


@dataclass(frozen=True)
class StepReset:
    """A step to run again: failure and wait-expiry counts 0, error cleared, pending now or
    waiting for its dependencies."""

    step_id: int
    kind: StepKind
    """A forward step gets `input` and loses its output; a compensation step keeps both (its
    input is the step it undoes)."""
    to_state: StepState
    idempotency_key: str
    input: Any = None


def lock_run(conn: Connection, run_id: int) -> Row[*tuple[Any, ...]] | None:
    """The run's row, locked against schedulers and other operators until commit (primary
    key); None when there is no such run."""
    return conn.execute(select(runs).where(runs.c.id == run_id).with_for_update()).first()


def run_state(conn: Connection, run_id: int) -> str:
    """The run's state now (primary key)."""
    return str(conn.execute(select(runs.c.state).where(runs.c.id == run_id)).scalar_one())


def lock_steps_in(
    conn: Connection, run_id: int, states: Collection[StepState]
) -> Sequence[Row[*tuple[Any, ...]]]:
    """The run id, id, name, state, attempt and agent of the run's steps in `states`, locked
    (uq_steps_run_id_kind_name)."""
    return conn.execute(
        select(
            steps.c.run_id,
            steps.c.id,
            steps.c.name,
            steps.c.state,
            steps.c.attempt,
            steps.c.agent,
        )
        .where(steps.c.run_id == run_id, steps.c.state.in_(sorted(states)))
        .with_for_update()
    ).all()


def cancel_steps(conn: Connection, step_ids: Collection[int]) -> None:
    """Cancel the steps; a step in flight is unlocked, so its late reply is fenced out (primary
    key)."""
    if step_ids:
        conn.execute(
            update(steps)
            .where(steps.c.id.in_(list(step_ids)))
            .values(state=StepState.CANCELLED, **leave_processing())
        )


def cancel_run(conn: Connection, run_id: int, *, compensate: bool, error: Any) -> RunState:
    """The run's own transition on cancel: `cancelled` (finished now) or, to undo what it did,
    `compensating`; returns the state it went to (primary key)."""
    to_state = RunState.COMPENSATING if compensate else RunState.CANCELLED
    values: dict[str, Any] = {"state": to_state, "updated_at": now(), "error": error}
    if not compensate:
        values["finished_at"] = now()
    conn.execute(update(runs).where(runs.c.id == run_id).values(**values))
    return to_state


def forward_steps(conn: Connection, run_id: int) -> list[Row[*tuple[Any, ...]]]:
    """The run's forward steps (uq_steps_run_id_kind_name)."""
    return list(
        conn.execute(
            select(steps).where(steps.c.run_id == run_id, steps.c.kind == StepKind.FORWARD)
        )
    )


def compensation_chain(conn: Connection, run_id: int) -> list[Row[*tuple[Any, ...]]]:
    """The run's compensation steps in the order they were chained (uq_steps_run_id_kind_name,
    then a sort by id)."""
    return list(
        conn.execute(
            select(steps)
            .where(steps.c.run_id == run_id, steps.c.kind == StepKind.COMPENSATION)
            .order_by(steps.c.id)
        )
    )


def reset_steps(conn: Connection, resets: Sequence[StepReset]) -> None:
    """Make the steps runnable again, ready now or waiting (primary key)."""
    for reset in resets:
        values: dict[str, Any] = {
            "state": reset.to_state,
            "error": None,
            "failure_count": 0,
            "wait_expiries": 0,
            "deferred_since": None,
            "not_before": now(),
            "idempotency_key": reset.idempotency_key,
            **leave_processing(),
        }
        if reset.kind == StepKind.FORWARD:
            values.update(input=reset.input, output=None)
        conn.execute(update(steps).where(steps.c.id == reset.step_id).values(**values))


def delete_map_items(conn: Connection, run_id: int, map_ids: Sequence[int]) -> None:
    """Delete the items of run `run_id`'s maps `map_ids`, which run over their lists again;
    the events keep their history (uq_steps_run_id_kind_name)."""
    if map_ids:
        conn.execute(
            delete(steps).where(steps.c.run_id == run_id, steps.c.map_parent.in_(sorted(map_ids)))
        )


def advance_later(conn: Connection, run_id: int) -> None:
    """The run needs a scheduler's advance duty, which makes its ready maps create their
    items (primary key)."""
    conn.execute(advance_queries.mark_advance(), {"b_id": run_id})


def delete_compensation_chain(conn: Connection, run_id: int) -> None:
    """Delete the run's compensation steps; the events keep their history
    (uq_steps_run_id_kind_name)."""
    conn.execute(
        delete(steps).where(steps.c.run_id == run_id, steps.c.kind == StepKind.COMPENSATION)
    )


def restart_run(conn: Connection, run_id: int, *, run_input: Any) -> None:
    """The run's own transition on resubmit: running again with `run_input`, its outcome
    cleared (primary key)."""
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(
            state=RunState.RUNNING,
            input=run_input,
            output=None,
            error=None,
            finished_at=None,
            updated_at=now(),
        )
    )


def restart_compensation(conn: Connection, run_id: int) -> None:
    """The run's own transition when its failed compensation is resubmitted: compensating
    again (primary key)."""
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(state=RunState.COMPENSATING, finished_at=None, updated_at=now())
    )


def acknowledge_run_alerts(conn: Connection, run_id: int, *, actor: str, reason: str) -> int:
    """Acknowledge the run's open alerts, an operator having acted on the run, closing the
    incidents left without an open alert; returns how many (ix_alerts_run_id)."""
    acked = conn.execute(
        update(alerts)
        .where(alerts.c.run_id == run_id, alerts.c.acknowledged.is_(False))
        .values(
            acknowledged=True,
            acknowledged_by=actor,
            acknowledge_reason=reason,
            acknowledged_at=now(),
        )
        .returning(alerts.c.incident_id)
    ).all()
    # An incident whose last open alert this was is over: it closes, with a resolved notice.
    close_if_done(conn, [row.incident_id for row in acked], actor=actor, reason=reason)
    return len(acked)
