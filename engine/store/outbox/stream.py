"""The subscription stream's rows: subscribers, and the updates they have not acknowledged.

The relay fans each published event out to the matching subscribers in the transaction that
publishes it (`fan_out`), so `stream_updates` is a durable outbox per subscriber: a stream sends
the rows due on it (`take_due`), ACKNOWLEDGE deletes them. A row is due when it was never sent
on the subscriber's current stream (so a reconnection re-sends every unacknowledged one), or
was sent on it longer than the resend timeout ago.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from sasflow.states import TERMINAL_RUN_STATES
from sasflow.store.dialect import has_notifications
from sasflow.store.schema import runs, stream_updates, subscribers
from sasflow.store.sqltime import now, plus_seconds


def channel(namespace: str) -> str:
    """The notification channel that wakes the streams of one namespace."""
    return f"sasflow:{namespace}:stream"


def notify_streams(conn: Connection, namespace: str) -> None:
    """Queue a wake-up for every API server's streams, sent at commit (nothing on SQLite)."""
    if has_notifications(conn):
        conn.execute(select(func.pg_notify(channel(namespace), "")))


@dataclass(frozen=True)
class Subscriber:
    """A subscriber's identity and filter (`submitted_by` set: only the runs that token
    submitted; `workflows` set: only runs of those workflows)."""

    id: str
    name: str
    owner: str
    workflows: tuple[str, ...] | None
    submitted_by: str | None

    def matches(self, workflow: str, submitted_by: str | None) -> bool:
        """True when a run of `workflow` submitted by `submitted_by` passes the filter."""
        if self.workflows is not None and workflow not in self.workflows:
            return False
        return self.submitted_by is None or self.submitted_by == submitted_by


def _subscriber(row: Any) -> Subscriber:
    workflows = None if row.workflows is None else tuple(row.workflows)
    return Subscriber(row.id, row.name, row.owner, workflows, row.submitted_by)


LIVE = subscribers.c.expired_at.is_(None)
"""Subscribers not expired: an expired one receives nothing and cannot reconnect while its
updates are deleted (store.outbox.stream_retention)."""

_SUBSCRIBER_COLUMNS = (
    subscribers.c.id,
    subscribers.c.name,
    subscribers.c.owner,
    subscribers.c.workflows,
    subscribers.c.submitted_by,
)


def create_subscriber(conn: Connection, subscriber: Subscriber, stream_id: str) -> None:
    """Record a new subscriber whose current stream is `stream_id` (primary key)."""
    conn.execute(
        insert(subscribers).values(
            id=subscriber.id,
            name=subscriber.name,
            owner=subscriber.owner,
            workflows=None if subscriber.workflows is None else list(subscriber.workflows),
            submitted_by=subscriber.submitted_by,
            stream_id=stream_id,
            seen_at=now(),
        )
    )


def reconnect_subscriber(conn: Connection, subscriber: Subscriber, stream_id: str) -> None:
    """Make `stream_id` the current stream of a known subscriber, ending any other one, with
    the name and filter it reconnects with (primary key)."""
    conn.execute(
        update(subscribers)
        .where(subscribers.c.id == subscriber.id)
        .values(
            name=subscriber.name,
            workflows=None if subscriber.workflows is None else list(subscriber.workflows),
            submitted_by=subscriber.submitted_by,
            stream_id=stream_id,
            connected_at=now(),
            seen_at=now(),
        )
    )


def touch(conn: Connection, subscriber_id: str) -> None:
    """Record that a stream of the subscriber is open now (at each of its heartbeats; primary
    key): a subscriber not seen for long is alerted, then expired."""
    conn.execute(update(subscribers).where(subscribers.c.id == subscriber_id).values(seen_at=now()))


def get_subscriber(conn: Connection, subscriber_id: str) -> Subscriber | None:
    """One subscriber, unless it expired (primary key)."""
    row = conn.execute(
        select(*_SUBSCRIBER_COLUMNS).where(subscribers.c.id == subscriber_id, LIVE)
    ).one_or_none()
    return None if row is None else _subscriber(row)


def subscriber_of_stream(conn: Connection, stream_id: str) -> Subscriber | None:
    """The subscriber whose current stream is `stream_id`, if any (uq_subscribers_stream_id)."""
    row = conn.execute(
        select(*_SUBSCRIBER_COLUMNS).where(subscribers.c.stream_id == stream_id, LIVE)
    ).one_or_none()
    return None if row is None else _subscriber(row)


def lock_if_current(conn: Connection, subscriber_id: str, stream_id: str) -> bool:
    """Lock the subscriber's row until the transaction ends, and tell whether `stream_id` is
    still its current stream (primary key)."""
    current = conn.execute(
        select(subscribers.c.stream_id).where(subscribers.c.id == subscriber_id).with_for_update()
    ).scalar_one_or_none()
    return current == stream_id


def delete_subscriber(conn: Connection, subscriber_id: str) -> None:
    """Delete a subscriber and, by cascade, its pending updates (primary key)."""
    conn.execute(delete(subscribers).where(subscribers.c.id == subscriber_id))


@dataclass(frozen=True)
class Due:
    """One update to send: `uuid` None for a RECONCILE answer, which needs no acknowledgement."""

    uuid: str | None
    body: dict[str, Any]


def take_due(
    conn: Connection, subscriber_id: str, stream_id: str, *, resend_after: float, limit: int
) -> list[Due]:
    """The subscriber's updates due on `stream_id`, oldest first, marked sent on it; RECONCILE
    answers are deleted as they are taken (ix_stream_updates_subscriber_id_id). Call with the
    subscriber's row locked (`lock_if_current`)."""
    due = conn.execute(
        select(stream_updates.c.id, stream_updates.c.uuid, stream_updates.c.body)
        .where(
            stream_updates.c.subscriber_id == subscriber_id,
            or_(
                stream_updates.c.sent_stream.is_(None),
                stream_updates.c.sent_stream != stream_id,
                plus_seconds(stream_updates.c.sent_at, resend_after) <= now(),
            ),
        )
        .order_by(stream_updates.c.id)
        .limit(limit)
    ).all()
    if not due:
        return []
    acked = [r.id for r in due if r.uuid is not None]
    once = [r.id for r in due if r.uuid is None]
    if acked:
        conn.execute(
            update(stream_updates)
            .where(stream_updates.c.id.in_(acked))
            .values(sent_stream=stream_id, sent_at=now())
        )
    if once:
        conn.execute(delete(stream_updates).where(stream_updates.c.id.in_(once)))
    return [Due(r.uuid, r.body) for r in due]


def acknowledge(conn: Connection, subscriber_id: str, update_uuids: Sequence[str]) -> int:
    """Forget updates the subscriber has handled; returns how many were pending
    (uq_stream_updates_uuid)."""
    result = conn.execute(
        delete(stream_updates).where(
            and_(
                stream_updates.c.uuid.in_(list(update_uuids)),
                stream_updates.c.subscriber_id == subscriber_id,
            )
        )
    )
    return int(result.rowcount)


def pending_count(conn: Connection, subscriber_id: str) -> int:
    """How many updates the subscriber has not acknowledged (ix_stream_updates_subscriber_id_id)."""
    return int(
        conn.execute(
            select(func.count())
            .select_from(stream_updates)
            .where(stream_updates.c.subscriber_id == subscriber_id)
        ).scalar_one()
    )


def all_subscribers(conn: Connection) -> list[Subscriber]:
    """Every subscriber not expired, for the relay's fan-out (a full scan of a small table)."""
    return [_subscriber(r) for r in conn.execute(select(*_SUBSCRIBER_COLUMNS).where(LIVE))]


@dataclass(frozen=True)
class FeedEvent:
    """What the fan-out needs of one published event."""

    run_id: int
    workflow: str
    submitted_by: str | None
    body: dict[str, Any]


def fan_out(conn: Connection, feed: Sequence[FeedEvent], *, namespace: str) -> int:
    """Queue each event for every subscriber whose filter it passes, in the caller's (the
    relay's) transaction, in the order given; returns how many updates were queued."""
    if not feed:
        return 0
    targets = all_subscribers(conn)
    if not targets:
        return 0
    rows = [
        {
            "subscriber_id": s.id,
            "uuid": str(uuid.uuid4()),
            "run_id": event.run_id,
            "body": event.body,
        }
        for event in feed
        for s in targets
        if s.matches(event.workflow, event.submitted_by)
    ]
    if rows:
        conn.execute(insert(stream_updates), rows)
        notify_streams(conn, namespace)
    return len(rows)


def queue_once(
    conn: Connection, subscriber_id: str, bodies: Iterable[tuple[int, dict[str, Any]]]
) -> int:
    """Queue (run id, body) answers that need no acknowledgement (RECONCILE); returns how many."""
    rows = [
        {"subscriber_id": subscriber_id, "uuid": None, "run_id": run_id, "body": body}
        for run_id, body in bodies
    ]
    if rows:
        conn.execute(insert(stream_updates), rows)
    return len(rows)


def queue_failures(conn: Connection, bodies: Sequence[dict[str, Any]], *, namespace: str) -> int:
    """Queue FAILURE records (an agent instance lost) for every subscriber, sent once and never
    acknowledged, in the caller's transaction (the supervisor's); returns how many."""
    if not bodies:
        return 0
    rows = [
        {"subscriber_id": s.id, "uuid": None, "run_id": None, "body": body}
        for body in bodies
        for s in all_subscribers(conn)
    ]
    if rows:
        conn.execute(insert(stream_updates), rows)
        notify_streams(conn, namespace)
    return len(rows)


_RUN_COLUMNS = (
    runs.c.id,
    runs.c.workflow,
    runs.c.submitted_by,
    runs.c.business_key,
    runs.c.state,
    runs.c.updated_at,
)


def runs_by_id(conn: Connection, run_ids: Sequence[int]) -> list[Any]:
    """The current state of the given runs (primary key)."""
    return list(
        conn.execute(select(*_RUN_COLUMNS).where(runs.c.id.in_(run_ids)).order_by(runs.c.id))
    )


def active_runs(conn: Connection, subscriber: Subscriber, *, limit: int) -> list[Any]:
    """Up to `limit` runs not in a terminal state that pass the subscriber's filter
    (ix_runs_state_created_at)."""
    query = select(*_RUN_COLUMNS).where(runs.c.state.not_in(sorted(TERMINAL_RUN_STATES)))
    if subscriber.workflows is not None:
        query = query.where(runs.c.workflow.in_(subscriber.workflows))
    if subscriber.submitted_by is not None:
        query = query.where(runs.c.submitted_by == subscriber.submitted_by)
    return list(conn.execute(query.order_by(runs.c.id).limit(limit)))
