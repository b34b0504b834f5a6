"""Storing an inbound event, idempotently on (name, the sender's id), and matching it at once
with an open wait when one is there (store.inbound.match); listing stored events."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from sasflow.approvals import RESERVED_EVENT_PREFIX
from sasflow.errors import InvalidEventError
from sasflow.registry import Registry
from sasflow.store.inbound import match, queries
from sasflow.store.notify import notify_ready
from sasflow.store.schema import inbound_events
from sasflow.waits import MAX_CORRELATION
from sasflow.workflow import NAME_PATTERN

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
"""How long an unmatched event waits for its wait to open, unless the sender says (7 days)."""
MAX_EVENT_ID = 200
MAX_PAYLOAD_BYTES = 256 * 1024
"""The largest payload (its JSON, in bytes) an event may carry: it becomes a step's output."""
SOURCES = frozenset({"api", "amqp", "cli"})


@dataclass(frozen=True)
class InboundEvent:
    """An event as a sender gives it (docs/protocol.md, "Events")."""

    name: str
    correlation: str
    event_id: str
    payload: Any = None
    retention_s: float = DEFAULT_RETENTION_S

    @classmethod
    def from_json(cls, body: Any) -> InboundEvent:
        """Validate a sender's document `{name, correlation, id, payload?, retention?}`; raises
        InvalidEventError naming the field."""
        if not isinstance(body, dict):
            raise InvalidEventError("body", "an event is a JSON object")
        name = body.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise InvalidEventError("name", f"name must match {NAME_PATTERN.pattern}, got {name!r}")
        if name.startswith(RESERVED_EVENT_PREFIX):
            raise InvalidEventError(
                "name", f"names starting with {RESERVED_EVENT_PREFIX!r} are reserved (approvals)"
            )
        correlation = body.get("correlation")
        if isinstance(correlation, int | float) and not isinstance(correlation, bool):
            correlation = str(correlation)
        if not isinstance(correlation, str) or not 0 < len(correlation) <= MAX_CORRELATION:
            raise InvalidEventError(
                "correlation",
                f"correlation must be a string (or number) of 1 to {MAX_CORRELATION} characters",
            )
        event_id = body.get("id")
        if not isinstance(event_id, str) or not 0 < len(event_id) <= MAX_EVENT_ID:
            raise InvalidEventError(
                "id", f"id must be a string of 1 to {MAX_EVENT_ID} characters (the sender's id)"
            )
        retention = body.get("retention", DEFAULT_RETENTION_S)
        if (
            not isinstance(retention, int | float)
            or isinstance(retention, bool)
            or not 0 < retention <= 10 * DEFAULT_RETENTION_S
        ):
            raise InvalidEventError(
                "retention", "retention must be seconds, > 0 and at most 70 days"
            )
        payload = body.get("payload")
        if len(json.dumps(payload).encode()) > MAX_PAYLOAD_BYTES:
            raise InvalidEventError(
                "payload", f"payload must be at most {MAX_PAYLOAD_BYTES} bytes of JSON"
            )
        return cls(name, correlation, event_id, payload, float(retention))


@dataclass(frozen=True)
class Stored:
    """What storing an event did."""

    id: int
    created: bool
    """False: an event with this name and id was stored before (nothing changed)."""
    step_id: int | None
    """The step it completed (now or before), if any."""
    run_id: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "duplicate": not self.created,
            "matched": self.step_id is not None,
            "step_id": self.step_id,
            "run_id": self.run_id,
        }


def store_event(
    conn: Connection,
    event: InboundEvent,
    *,
    source: str,
    namespace: str,
    actor: str,
    registry: Registry | None = None,
) -> Stored:
    """Store `event` in the caller's transaction, unless stored before (same name and id), and
    complete the open wait it matches now, if any and its run is not held by another
    transaction; else the schedulers match it (they are woken at commit). `registry`: the
    caller's, to advance the run past the wait at once (without one a scheduler does)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    inserted = conn.execute(
        queries.insert_event(conn),
        {
            "b_name": event.name,
            "b_event_id": event.event_id,
            "b_correlation": event.correlation,
            "b_payload": event.payload,
            "b_source": source,
            "b_retention": event.retention_s,
        },
    ).scalar_one_or_none()
    if inserted is not None:
        match.match(conn, registry, batch=1, namespace=namespace, actor=actor, event=inserted)
        notify_ready(conn, namespace)  # the event duty looks, whether matched or not
    row = conn.execute(
        queries.event_by_sender_id(), {"b_name": event.name, "b_event_id": event.event_id}
    ).one()
    return Stored(row.id, inserted is not None, row.consumed_step_id, row.run_id)


def is_stored(conn: Connection, name: str, event_id: str) -> bool:
    """Whether the event (`name`, sender's `event_id`) is stored (consumed or not)."""
    found = conn.execute(
        select(inbound_events.c.id).where(
            inbound_events.c.name == name, inbound_events.c.event_id == event_id
        )
    ).first()
    return found is not None


def list_events(conn: Connection, *, unmatched: bool = False, limit: int = 100) -> list[Any]:
    """Stored events, newest first (`unmatched`: only those not consumed yet), as documents."""
    statement = queries.listing()
    if unmatched:
        statement = statement.where(inbound_events.c.consumed_at.is_(None))
    rows = conn.execute(statement, {"b_limit": limit}).all()
    return [
        {
            "id": r.id,
            "name": r.name,
            "event_id": r.event_id,
            "correlation": r.correlation,
            "payload": r.payload,
            "source": r.source,
            "received_at": r.received_at.isoformat(),
            "expires_at": r.expires_at.isoformat(),
            "consumed_at": None if r.consumed_at is None else r.consumed_at.isoformat(),
            "step_id": r.consumed_step_id,
            "run_id": r.run_id,
            "step": r.step,
        }
        for r in rows
    ]
