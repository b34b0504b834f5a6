"""Timers and event waits of the runs whose business key starts with a prefix: what waits now
(the demo's live view) and what happened (its summary). Companion of `inspect.count_prefix`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, exists, func, select

from sasflow.states import StepState
from sasflow.store.schema import events, inbound_events, runs, steps
from sasflow.waits import EVENT_AGENT
from sasflow.workflow import TIMER_AGENT


@dataclass(frozen=True)
class Waiting:
    """Open timers or event waits of one step name."""

    step: str
    kind: str
    """`timer` or `event`."""
    event: str | None
    """The event waited for (event waits)."""
    count: int
    next_due: datetime
    """The earliest `not_before` among them: a timer's wake-up, a wait's timeout."""


@dataclass(frozen=True)
class WaitCounts:
    """What the store holds of the prefix's timers and event waits."""

    timers_fired: int
    """Timer steps processed (step events `pending -> processed` of reason `timer`)."""
    events_matched: int
    """Event waits completed by an event (reason `event`)."""
    events_before_wait: int
    """Of those, the ones whose event was stored before the wait opened (stored-first)."""
    event_timeouts: int
    """Event waits that timed out (reason `event timeout`)."""


def _run_ids(prefix: str) -> ColumnElement[int]:
    return (
        select(runs.c.id)
        .where(runs.c.business_key.startswith(prefix, autoescape=True))
        .scalar_subquery()
    )


def open_waits(conn: Connection, prefix: str) -> list[Waiting]:
    """The prefix's pending timer and event-wait steps, by step name."""
    rows = conn.execute(
        select(
            steps.c.name,
            steps.c.agent,
            steps.c.action,
            func.count().label("n"),
            func.min(steps.c.not_before).label("next_due"),
        )
        .where(
            steps.c.run_id.in_(_run_ids(prefix)),
            steps.c.state == StepState.PENDING,
            steps.c.agent.in_((EVENT_AGENT, TIMER_AGENT)),
        )
        .group_by(steps.c.name, steps.c.agent, steps.c.action)
        .order_by(steps.c.name)
    )
    return [
        Waiting(
            step=row.name,
            kind="event" if row.agent == EVENT_AGENT else "timer",
            event=row.action if row.agent == EVENT_AGENT else None,
            count=int(row.n),
            next_due=row.next_due,
        )
        for row in rows
    ]


def count_waits(conn: Connection, prefix: str) -> WaitCounts:
    """The counts of the prefix's fired timers, matched and timed-out event waits."""
    ids = _run_ids(prefix)

    def processed_by(reason: str) -> int:
        return int(
            conn.execute(
                select(func.count())
                .select_from(events)
                .where(
                    events.c.run_id.in_(ids),
                    events.c.entity == "step",
                    events.c.reason == reason,
                    events.c.to_state.in_((StepState.PROCESSED, StepState.ERROR)),
                )
            ).scalar_one()
        )

    opened_later = exists().where(
        events.c.run_id == steps.c.run_id,
        events.c.step_id == inbound_events.c.consumed_step_id,
        events.c.reason == "event wait",
        events.c.created_at > inbound_events.c.received_at,
    )
    before = conn.execute(
        select(func.count())
        .select_from(inbound_events)
        .join(steps, steps.c.id == inbound_events.c.consumed_step_id)
        .where(steps.c.run_id.in_(ids), opened_later)
    ).scalar_one()
    return WaitCounts(
        timers_fired=processed_by("timer"),
        events_matched=processed_by("event"),
        events_before_wait=int(before),
        event_timeouts=processed_by("event timeout"),
    )
