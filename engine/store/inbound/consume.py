"""A wait that opens takes its event at once: in the transaction that opens it (the advance of
its run, which holds the run's lock), the oldest stored event of its name and correlation is
consumed and the wait completed with its payload (store.runs.advance). An event another
transaction holds, or one committed after this transaction's statement began, is left to its
own ingress or to the schedulers' event duty (store.inbound.match)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from sasflow.store.inbound import queries


@dataclass(frozen=True)
class Consumed:
    """The event a wait took when it opened."""

    event_id: str
    payload: Any


def consume_at_open(conn: Connection, step_id: int, name: str, correlation: str) -> Consumed | None:
    """Complete the open wait `step_id` with the oldest matching stored event, if any."""
    event = conn.execute(
        queries.oldest_unmatched(), {"b_name": name, "b_correlation": correlation}
    ).one_or_none()
    if event is None:
        return None
    done = conn.execute(
        queries.complete_wait(), {"b_id": step_id, "b_output": event.payload}
    ).one_or_none()
    if done is None:
        return None
    conn.execute(queries.consume_event(), {"b_event": event.id, "b_step": step_id})
    return Consumed(event.event_id, event.payload)
