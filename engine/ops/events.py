"""Inbound events for event waits (`Step.wait_for`), the one service behind `POST /v1/events`,
the `<ns>.events` queue and `sasflow events send|list` (docs/concepts.md, "Event waits";
docs/protocol.md, "Events"): validate, store idempotently, match at once when a wait is open.
"""

from __future__ import annotations

from typing import Any

from sasflow.registry import Registry
from sasflow.store.db import Connection
from sasflow.store.inbound import ingest

MAX_LISTED = 1000


def send_event(
    conn: Connection,
    body: Any,
    *,
    source: str,
    namespace: str,
    actor: str,
    registry: Registry | None = None,
) -> dict[str, Any]:
    """Validate `body` (`{name, correlation, id, payload?, retention?}`; InvalidEventError names
    the field) and store it in the caller's transaction: `{id, duplicate, matched, step_id,
    run_id}`."""
    event = ingest.InboundEvent.from_json(body)
    stored = ingest.store_event(
        conn, event, source=source, namespace=namespace, actor=actor, registry=registry
    )
    return stored.to_json()


def list_events(conn: Connection, *, unmatched: bool = False, limit: int = 100) -> list[Any]:
    """Stored events, newest first; `unmatched`: only those no wait consumed yet."""
    return ingest.list_events(conn, unmatched=unmatched, limit=max(1, min(limit, MAX_LISTED)))
