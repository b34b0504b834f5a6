"""Subscribers that went away: found by when a stream of theirs was last open, expired (they
receive nothing more and cannot reconnect), then deleted with their updates in batches, so no
transaction deletes a week of updates at once while the relay waits on the subscriber's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, exists, func, select, update

from sasflow.store.outbox.stream import LIVE
from sasflow.store.schema import stream_updates, subscribers
from sasflow.store.sqltime import now, plus_seconds

SEEN = func.coalesce(subscribers.c.seen_at, subscribers.c.connected_at)
"""When a stream of the subscriber was last known open."""


@dataclass(frozen=True)
class Away:
    """A subscriber with no stream seen for a while."""

    id: str
    name: str
    owner: str
    seen_at: datetime
    """When a stream of it was last known open."""
    away_s: float
    """Seconds since then, by the database's clock."""


def away_longer_than(conn: Connection, seconds: float, *, limit: int) -> list[Away]:
    """Up to `limit` live subscribers not seen for more than `seconds`, the longest away first
    (a scan of the small subscribers table)."""
    query = (
        select(
            subscribers.c.id,
            subscribers.c.name,
            subscribers.c.owner,
            SEEN.label("seen_at"),
            now().label("now"),
        )
        .where(LIVE, plus_seconds(now(), -seconds) > SEEN)
        .order_by(SEEN, subscribers.c.id)
        .limit(limit)
    )
    return [
        Away(r.id, r.name, r.owner, r.seen_at, (r.now - r.seen_at).total_seconds())
        for r in conn.execute(query)
    ]


def seen_since(conn: Connection, subscriber_ids: list[str]) -> dict[str, datetime]:
    """When each live subscriber of `subscriber_ids` was last seen (primary key); an expired
    or deleted one is absent."""
    if not subscriber_ids:
        return {}
    rows = conn.execute(
        select(subscribers.c.id, SEEN.label("seen_at")).where(
            subscribers.c.id.in_(subscriber_ids), LIVE
        )
    )
    return {r.id: r.seen_at for r in rows}


def expire(conn: Connection, subscriber_id: str, *, seen_before: datetime) -> bool:
    """Expire the subscriber if it is still live and not seen since `seen_before` (a stream
    that opened meanwhile saves it): its stream ends and nothing more is queued for it.
    Returns whether it expired (primary key)."""
    done = conn.execute(
        update(subscribers)
        .where(subscribers.c.id == subscriber_id, LIVE, seen_before >= SEEN)
        .values(expired_at=now(), stream_id=None)
        .returning(subscribers.c.id)
    ).first()
    return done is not None


def delete_expired_updates(conn: Connection, *, batch: int) -> int:
    """Delete up to `batch` updates of expired subscribers; returns how many
    (ix_stream_updates_subscriber_id_id)."""
    expired = select(subscribers.c.id).where(subscribers.c.expired_at.is_not(None))
    taken = (
        select(stream_updates.c.id)
        .where(stream_updates.c.subscriber_id.in_(expired.scalar_subquery()))
        .limit(batch)
    )
    result = conn.execute(
        delete(stream_updates).where(stream_updates.c.id.in_(taken.scalar_subquery()))
    )
    return int(result.rowcount)


def delete_emptied(conn: Connection) -> int:
    """Delete the expired subscribers that have no update left; returns how many
    (ix_stream_updates_subscriber_id_id)."""
    left = exists().where(stream_updates.c.subscriber_id == subscribers.c.id)
    result = conn.execute(delete(subscribers).where(subscribers.c.expired_at.is_not(None), ~left))
    return int(result.rowcount)
