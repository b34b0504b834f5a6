"""Publish recorded events as status notifications (the events table is the outbox).

Any process with the database and the broker may relay; rows are locked with SKIP LOCKED so
relays never publish the same event concurrently. Delivery is at least once: an event is
marked published only after the broker confirmed it, so consumers dedupe on `event_id`.
The same transaction queues each event for the subscription stream's matching subscribers
(`store.stream.fan_out`), so the stream's updates follow the events' order too.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sasflow.errors import BrokerUnavailableError
from sasflow.hooks import NO_HOOKS, Hooks
from sasflow.messages import StatusEvent
from sasflow.store import events, stream
from sasflow.store.db import Engine, transaction
from sasflow.transport.base import Outgoing, Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)


def routing_key(workflow: str, entity: str, state: str) -> str:
    """`<workflow>.<run|step>.<state>`, e.g. `order.run.completed`."""
    return f"{workflow}.{entity}.{state}"


def relay_events(
    engine: Engine, transport: Transport, names: Names, *, limit: int = 500, hooks: Hooks = NO_HOOKS
) -> int:
    """Publish up to `limit` unpublished events as one batch; returns how many were relayed.

    The rows stay locked until the batch is confirmed and they are marked, in one transaction.
    """
    started = time.monotonic()
    with transaction(engine) as conn:
        rows = events.take_unpublished(conn, limit=limit)
        if not rows:
            return 0
        messages: list[Outgoing] = []
        owners: list[int] = []
        feed: list[stream.FeedEvent] = []
        for row in rows:
            body = StatusEvent(
                event_id=row.id,
                run_id=row.run_id,
                key=row.business_key,
                workflow=row.workflow,
                version=row.version,
                entity=row.entity,
                step=row.step,
                state=row.to_state,
                previous=row.from_state,
                attempt=row.attempt,
                at=row.created_at.isoformat(),
                reason=row.reason,
                detail=row.detail,
            ).encode()
            headers = {"run_id": row.run_id, "key": row.business_key}
            messages.append(
                Outgoing(
                    names.status, routing_key(row.workflow, row.entity, row.to_state), body, headers
                )
            )
            owners.append(row.id)
            if row.reply_to:
                messages.append(Outgoing("", row.reply_to, body, headers))
                owners.append(row.id)
            feed.append(_feed_event(row))
        for event_id, result in zip(owners, transport.publish_many(messages), strict=True):
            if isinstance(result, BrokerUnavailableError):
                raise result  # not sent: nothing is marked, the next relay publishes again
            if result is not None:
                # Refused for good (e.g. too large): one bad event must not block the others.
                log.error("status event %s not published: %s", event_id, result)
        events.mark_published(conn, [r.id for r in rows])
        stream.fan_out(conn, feed, namespace=names.namespace)
    hooks.events_relayed(len(rows), time.monotonic() - started)
    return len(rows)


def _feed_event(row: Any) -> stream.FeedEvent:
    """The subscription stream's UPDATE of one event (its `uuid` is added per subscriber)."""
    body: dict[str, Any] = {
        "run": row.run_id,
        "workflow": row.workflow,
        "key": row.business_key,
        "entity": row.entity,
        "state": row.to_state,
        "previous": row.from_state,
        "at": row.created_at.isoformat(),
        "event_id": row.id,
    }
    if row.step is not None:
        body["step"] = row.step
    if row.reason is not None:
        body["reason"] = row.reason
    return stream.FeedEvent(row.run_id, row.workflow, row.submitted_by, body)
