"""The statements of inbound events and event waits, each naming the index that serves it."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Delete,
    Float,
    Select,
    Update,
    bindparam,
    delete,
    func,
    select,
    update,
)

from sasflow.states import ACTIVE_RUN_STATES, StepState
from sasflow.store.dialect import upsert_insert
from sasflow.store.schema import inbound_events, runs, steps
from sasflow.store.sqltime import now, plus_seconds
from sasflow.waits import EVENT_AGENT

_open_wait = (steps.c.state == StepState.PENDING, steps.c.agent == EVENT_AGENT)
_unmatched = inbound_events.c.consumed_at.is_(None)


def insert_event(conn: Connection) -> Any:
    """Store an event unless one with the same name and id is stored (its unique constraint);
    returns its id, or nothing for a duplicate."""
    return (
        upsert_insert(conn, inbound_events)
        .values(
            name=bindparam("b_name"),
            event_id=bindparam("b_event_id"),
            correlation=bindparam("b_correlation"),
            payload=bindparam("b_payload"),
            source=bindparam("b_source"),
            expires_at=plus_seconds(now(), bindparam("b_retention", type_=Float())),
        )
        .on_conflict_do_nothing(index_elements=["name", "event_id"])
        .returning(inbound_events.c.id)
    )


@cache
def event_by_sender_id() -> Select[Any]:
    """A stored event by name and sender's id, with the step and run it completed (unique)."""
    return (
        select(inbound_events, steps.c.run_id, steps.c.name.label("step"))
        .outerjoin(steps, steps.c.id == inbound_events.c.consumed_step_id)
        .where(
            inbound_events.c.name == bindparam("b_name"),
            inbound_events.c.event_id == bindparam("b_event_id"),
        )
    )


@cache
def matches() -> Select[Any]:
    """Up to :b_batch pairs of an unmatched, unexpired event and an open wait of an active run
    with its name and correlation, oldest event first; the events locked, skipping those
    another transaction holds (ix_inbound_events_unmatched, then ix_steps_event_waits)."""
    return (
        select(
            inbound_events.c.id.label("event"),
            inbound_events.c.event_id,
            inbound_events.c.name,
            inbound_events.c.correlation,
            inbound_events.c.payload,
            steps.c.id.label("step_id"),
            steps.c.run_id,
        )
        .join(
            steps,
            (steps.c.action == inbound_events.c.name)
            & (steps.c.correlation == inbound_events.c.correlation),
        )
        .join(runs, runs.c.id == steps.c.run_id)
        .where(
            _unmatched,
            inbound_events.c.expires_at > now(),
            *_open_wait,
            runs.c.state.in_(ACTIVE_RUN_STATES),
        )
        .order_by(inbound_events.c.received_at, inbound_events.c.id, steps.c.id)
        .limit(bindparam("b_batch"))
        .with_for_update(of=inbound_events, skip_locked=True)
    )


@cache
def matches_of_event() -> Select[Any]:
    """`matches` for one event (:b_event, just stored) only."""
    return matches().where(inbound_events.c.id == bindparam("b_event"))


@cache
def oldest_unmatched() -> Select[Any]:
    """The oldest unmatched, unexpired event of :b_name and :b_correlation, locked, skipping one
    another transaction holds (ix_inbound_events_unmatched)."""
    return (
        select(inbound_events.c.id, inbound_events.c.event_id, inbound_events.c.payload)
        .where(
            inbound_events.c.name == bindparam("b_name"),
            inbound_events.c.correlation == bindparam("b_correlation"),
            _unmatched,
            inbound_events.c.expires_at > now(),
        )
        .order_by(inbound_events.c.received_at, inbound_events.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )


@cache
def complete_wait() -> Update:
    """Fenced: an open wait becomes processed with the event's payload (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), *_open_wait)
        .values(
            state=StepState.PROCESSED,
            output=bindparam("b_output"),
            correlation=None,
            escalate_at=None,
            updated_at=now(),
        )
        .returning(steps.c.id, steps.c.run_id, steps.c.name)
    )


@cache
def consume_event() -> Update:
    """Fenced: an unmatched event is consumed by step :b_step (primary key)."""
    return (
        update(inbound_events)
        .where(inbound_events.c.id == bindparam("b_event"), _unmatched)
        .values(consumed_step_id=bindparam("b_step"), consumed_at=now())
    )


@cache
def due_timeouts() -> Select[Any]:
    """Up to :b_batch open waits of active runs whose timeout passed, earliest first
    (ix_steps_event_timeouts)."""
    return (
        select(steps.c.id, steps.c.run_id, steps.c.name, steps.c.input)
        .join(runs, runs.c.id == steps.c.run_id)
        .where(*_open_wait, steps.c.not_before <= now(), runs.c.state.in_(ACTIVE_RUN_STATES))
        .order_by(steps.c.not_before, steps.c.id)
        .limit(bindparam("b_batch"))
    )


@cache
def next_timeout() -> Select[Any]:
    """When the earliest open wait times out, and the database's time now
    (ix_steps_event_timeouts)."""
    return select(func.min(steps.c.not_before).label("due"), now().label("now")).where(*_open_wait)


@cache
def time_out() -> Update:
    """Fenced: an open wait past its timeout becomes :b_state with :b_output or :b_error
    (primary key)."""
    return (
        update(steps)
        .where(steps.c.id == bindparam("b_id"), *_open_wait, steps.c.not_before <= now())
        .values(
            state=bindparam("b_state"),
            output=bindparam("b_output"),
            error=bindparam("b_error"),
            correlation=None,
            escalate_at=None,
            updated_at=now(),
        )
        .returning(steps.c.id, steps.c.run_id, steps.c.name)
    )


@cache
def expire() -> Delete:
    """Delete up to :b_batch unmatched events past their retention (ix_inbound_events_expiry)."""
    expired = (
        select(inbound_events.c.id)
        .where(_unmatched, inbound_events.c.expires_at <= now())
        .limit(bindparam("b_batch"))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return delete(inbound_events).where(inbound_events.c.id.in_(expired))


@cache
def listing() -> Select[Any]:
    """Stored events, newest first, with the step and run that consumed them (primary key)."""
    return (
        select(inbound_events, steps.c.run_id, steps.c.name.label("step"))
        .outerjoin(steps, steps.c.id == inbound_events.c.consumed_step_id)
        .order_by(inbound_events.c.id.desc())
        .limit(bindparam("b_limit"))
    )
