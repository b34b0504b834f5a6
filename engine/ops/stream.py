"""The subscription stream's calls (SUBSCRIBE, ACKNOWLEDGE, RECONCILE, KILL, TEARDOWN) as
service functions: the HTTP API's stream router is their only face today.

Each call but SUBSCRIBE names a stream; it must be its subscriber's current one
(`StaleStreamError` otherwise), and the caller must be the subscriber's owner (the token that
subscribed). KILL and TEARDOWN cancel through `ops.cancel`, so they are recorded in the run's
events with the token's name as the actor.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sasflow.errors import RunNotFoundError, StaleStreamError, SubscriberNotFoundError
from sasflow.ops.cancel import cancel
from sasflow.states import CANCELLABLE_RUN_STATES
from sasflow.store.db import Connection
from sasflow.store.outbox import stream
from sasflow.store.outbox.stream import Subscriber

RECONCILE_LIMIT = 10_000
"""At most this many runs answer one RECONCILE of all active runs (oldest first)."""


@dataclass(frozen=True)
class StreamFilter:
    """Which runs' changes a subscriber receives: all, those of `workflows`, and/or only those
    its own token submitted."""

    workflows: tuple[str, ...] | None = None
    runs_submitted_by_me: bool = False


def subscribe(
    conn: Connection,
    *,
    name: str,
    subscriber_id: str | None,
    where: StreamFilter,
    owner: str,
    namespace: str,
) -> tuple[Subscriber, str]:
    """Open a stream: a new subscriber without `subscriber_id`, else a reconnection (the
    subscriber's filter becomes `where`; its unacknowledged updates are all due again).
    Returns the subscriber and the new stream id; any other stream of it ends."""
    stream_id = str(uuid.uuid4())
    wanted = Subscriber(
        id=subscriber_id or str(uuid.uuid4()),
        name=name,
        owner=owner,
        workflows=where.workflows,
        submitted_by=owner if where.runs_submitted_by_me else None,
    )
    if subscriber_id is None:
        stream.create_subscriber(conn, wanted, stream_id)
        return wanted, stream_id
    known = stream.get_subscriber(conn, subscriber_id)
    if known is None or known.owner != owner:
        raise SubscriberNotFoundError(f"no subscriber {subscriber_id} of token {owner!r}")
    stream.reconnect_subscriber(conn, wanted, stream_id)
    stream.notify_streams(conn, namespace)  # the replaced stream ends at once
    return wanted, stream_id


def current_subscriber(conn: Connection, stream_id: str, *, owner: str) -> Subscriber:
    """The subscriber whose current stream is `stream_id`, if `owner` is its owner."""
    found = stream.subscriber_of_stream(conn, stream_id)
    if found is None or found.owner != owner:
        raise StaleStreamError(f"stream {stream_id} is not a current stream of token {owner!r}")
    return found


def acknowledge(
    conn: Connection, stream_id: str, update_uuids: Sequence[str], *, owner: str
) -> int:
    """Forget handled updates; returns how many were pending. One not pending (acknowledged
    twice, or never sent to this subscriber) is accepted all the same: a repeated
    ACKNOWLEDGE is harmless."""
    subscriber = current_subscriber(conn, stream_id, owner=owner)
    return stream.acknowledge(conn, subscriber.id, update_uuids)


def reconcile(
    conn: Connection, stream_id: str, run_ids: Sequence[int], *, owner: str, namespace: str
) -> int:
    """Queue the current state of `run_ids` (all active runs of the filter when empty) as
    UPDATEs without uuid on the stream; returns how many. An unknown run is answered with
    `state` null."""
    subscriber = current_subscriber(conn, stream_id, owner=owner)
    if run_ids:
        rows = stream.runs_by_id(conn, run_ids)
        found = {r.id for r in rows}
        missing = [
            (run_id, {"run": run_id, "state": None, "reason": "no such run"})
            for run_id in dict.fromkeys(run_ids)
            if run_id not in found
        ]
    else:
        rows = stream.active_runs(conn, subscriber, limit=RECONCILE_LIMIT)
        missing = []
    answers = [(r.id, _reconciled(r)) for r in rows] + missing
    queued = stream.queue_once(conn, subscriber.id, answers)
    stream.notify_streams(conn, namespace)
    return queued


def _reconciled(row: Any) -> dict[str, Any]:
    return {
        "run": row.id,
        "workflow": row.workflow,
        "key": row.business_key,
        "entity": "run",
        "state": row.state,
        "at": row.updated_at.isoformat(),
    }


def kill(
    conn: Connection,
    stream_id: str,
    run_id: int,
    *,
    owner: str,
    may_operate: bool,
    namespace: str,
) -> str:
    """Cancel a run: one this token submitted, or any run with the `operate` scope. Returns
    the run's new state."""
    subscriber = current_subscriber(conn, stream_id, owner=owner)
    rows = stream.runs_by_id(conn, [run_id])
    if not rows or not (may_operate or rows[0].submitted_by == owner):
        # Not telling a run that exists from one that does not, to a token that may not see it.
        raise RunNotFoundError(f"no run {run_id} submitted by token {owner!r}")
    done = cancel(
        conn,
        run_id,
        actor=owner,
        reason=f"KILL from subscriber {subscriber.name!r}",
        namespace=namespace,
    )
    return done.state


def teardown(conn: Connection, stream_id: str, *, owner: str, namespace: str) -> list[int]:
    """Cancel the subscriber's runs (those its token submitted that pass its filter and can
    still be cancelled), delete the subscriber with its pending updates and end its stream.
    Returns the cancelled runs."""
    subscriber = current_subscriber(conn, stream_id, owner=owner)
    own = dataclasses.replace(subscriber, submitted_by=owner)
    cancelled = []
    for row in stream.active_runs(conn, own, limit=RECONCILE_LIMIT):
        if row.state in CANCELLABLE_RUN_STATES:
            cancel(
                conn,
                row.id,
                actor=owner,
                reason=f"TEARDOWN of subscriber {subscriber.name!r}",
                namespace=namespace,
            )
            cancelled.append(row.id)
    stream.delete_subscriber(conn, subscriber.id)
    stream.notify_streams(conn, namespace)
    return cancelled
