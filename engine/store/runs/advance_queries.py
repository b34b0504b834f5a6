"""The statements that apply what advancing a run decided (`store.advance`), each named, each
with the index that serves it; the reads it starts from are `queries.runs_by_id`,
`queries.lock_runs_of_steps` and `queries.steps_of_runs`.

They run on every reply that changes a run, so each builder is cached like those of
`store.queries` (built once per process; SQLAlchemy caches the compiled form). A step's
transition names the state it leaves, so a step that changed meanwhile is not touched.
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import Float, Insert, Update, bindparam, func, insert, update

from sasflow.states import NOT_STARTED_STEP_STATES, StepState
from sasflow.store.schema import runs, steps
from sasflow.store.sqltime import now, plus_seconds
from sasflow.store.types import Timestamp


@cache
def make_ready() -> Update:
    """A waiting step becomes pending now, with its input :b_input (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(
            state=StepState.PENDING, input=bindparam("b_input"), not_before=now(), updated_at=now()
        )
    )


@cache
def start_timer() -> Update:
    """A waiting timer step becomes pending with its input :b_input, due :b_seconds from now
    (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(
            state=StepState.PENDING,
            input=bindparam("b_input"),
            not_before=plus_seconds(now(), bindparam("b_seconds", type_=Float())),
            updated_at=now(),
        )
    )


@cache
def open_wait() -> Update:
    """A waiting event wait opens: pending with its input :b_input and :b_correlation, timing
    out :b_seconds from now (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(
            state=StepState.PENDING,
            input=bindparam("b_input"),
            correlation=bindparam("b_correlation"),
            not_before=plus_seconds(now(), bindparam("b_seconds", type_=Float())),
            updated_at=now(),
        )
    )


@cache
def escalate_at() -> Update:
    """An approval that just opened is overdue :b_seconds from now (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"))
        .values(escalate_at=plus_seconds(now(), bindparam("b_seconds", type_=Float())))
    )


@cache
def start_timer_until() -> Update:
    """A waiting timer step becomes pending with its input :b_input, due at :b_until (primary
    key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(
            state=StepState.PENDING,
            input=bindparam("b_input"),
            not_before=bindparam("b_until", type_=Timestamp()),
            updated_at=now(),
        )
    )


@cache
def expand_map() -> Update:
    """A waiting map step whose items were just created keeps waiting, with what it runs over
    as its input :b_input (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(input=bindparam("b_input"), updated_at=now())
    )


@cache
def end_map() -> Update:
    """A waiting map step ends in :b_state with its output and error; a child step too, when
    the child its key names had ended already (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(
            state=bindparam("b_state"),
            output=bindparam("b_output"),
            error=bindparam("b_error"),
            updated_at=now(),
        )
    )


@cache
def insert_items() -> Insert:
    """The step records of a map's items (primary key)."""
    return insert(steps)


@cache
def release_waiting() -> Update:
    """A waiting compensation step, or a map's waiting item, becomes pending now; its input
    came with it (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(state=StepState.PENDING, not_before=now(), updated_at=now())
    )


@cache
def fail_waiting() -> Update:
    """A waiting step whose input could not be built goes to error with :b_error (primary
    key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state == StepState.WAITING)
        .values(state=StepState.ERROR, error=bindparam("b_error"), updated_at=now())
    )


@cache
def skip() -> Update:
    """A step not started is skipped; no row when a scheduler claimed it meanwhile (primary
    key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), steps.c.state.in_(NOT_STARTED_STEP_STATES))
        .values(state=StepState.SKIPPED, locked_by=None, updated_at=now())
    )


@cache
def set_run_state() -> Update:
    """A run goes on in state :b_state with the error :b_error (primary key)."""
    return (
        update(runs)
        .where(runs.c.id == bindparam("b_id"))
        .values(state=bindparam("b_state"), error=bindparam("b_error"), updated_at=now())
    )


@cache
def finish_run() -> Update:
    """A run ends in state :b_state with its output and error (primary key)."""
    return (
        update(runs)
        .where(runs.c.id == bindparam("b_id"))
        .values(
            state=bindparam("b_state"),
            output=bindparam("b_output"),
            error=bindparam("b_error"),
            updated_at=now(),
            finished_at=now(),
        )
    )


@cache
def insert_steps() -> Insert:
    """New step records (a compensation chain), with their ids in the order given (primary
    key)."""
    return insert(steps).returning(steps.c.id, steps.c.name, sort_by_parameter_order=True)


@cache
def mark_advance() -> Update:
    """The run needs a scheduler's advance duty (store.runs.deferred): due now, unless a
    scheduler holds it already (its hold stays: it decides again from the rows when it is
    done) (primary key)."""
    return (
        update(runs)
        .where(runs.c.id == bindparam("b_id"))
        .values(advance_due=func.coalesce(runs.c.advance_due, now()))
    )
