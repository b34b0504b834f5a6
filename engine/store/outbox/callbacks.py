"""The HTTP callbacks outbox: written when a run with a callback_url ends, in that same
transaction (from `events.record`), and claimed by the API servers' delivery loops."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from sasflow.states import CallbackState
from sasflow.store.outbox.alerts import Alert, AlertKind, raise_alert
from sasflow.store.schema import callbacks, runs
from sasflow.store.sqltime import now, plus_seconds


def enqueue(conn: Connection, run_ids: Sequence[int]) -> int:
    """One callback for each of these (just ended) runs that asked for one (primary key)."""
    ended = conn.execute(
        select(
            runs.c.id,
            runs.c.workflow,
            runs.c.version,
            runs.c.business_key,
            runs.c.state,
            runs.c.output,
            runs.c.error,
            runs.c.submitted_by,
            runs.c.callback_url,
            runs.c.created_at,
            runs.c.finished_at,
        ).where(runs.c.id.in_(sorted(run_ids)), runs.c.callback_url.is_not(None))
    ).all()
    if not ended:
        return 0
    rows = []
    for run in ended:
        key = uuid.uuid4().hex
        rows.append(
            {
                "run_id": run.id,
                "url": run.callback_url,
                "idempotency_key": key,
                "payload": summary(run, key),
                "state": CallbackState.PENDING,
            }
        )
    conn.execute(insert(callbacks), rows)
    return len(rows)


def summary(run: Any, key: str) -> dict[str, Any]:
    """What a callback POSTs: the run as it ended, and the callback's idempotency key."""
    return {
        "idempotency_key": key,
        "run": {
            "id": run.id,
            "workflow": run.workflow,
            "version": run.version,
            "key": run.business_key,
            "state": run.state,
            "output": run.output,
            "error": run.error,
            "submitted_by": run.submitted_by,
            "created_at": _iso(run.created_at),
            "finished_at": _iso(run.finished_at),
        },
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def claim_due(
    conn: Connection, *, limit: int, lease_s: float, give_up_s: float
) -> Sequence[Row[Any]]:
    """Take up to `limit` due callbacks (ix_callbacks_due, SKIP LOCKED): each attempt is counted
    and its next one pushed `lease_s` ahead, so another server leaves it alone while this one
    POSTs it; `expired` says whether it is older than `give_up_s`."""
    due = (
        select(callbacks.c.id)
        .where(callbacks.c.state == CallbackState.PENDING, callbacks.c.next_attempt_at <= now())
        .order_by(callbacks.c.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    return conn.execute(
        update(callbacks)
        .where(callbacks.c.id == due.c.id)
        .values(attempts=callbacks.c.attempts + 1, next_attempt_at=plus_seconds(now(), lease_s))
        .returning(
            callbacks.c.id,
            callbacks.c.run_id,
            callbacks.c.url,
            callbacks.c.idempotency_key,
            callbacks.c.payload,
            callbacks.c.attempts,
            (callbacks.c.created_at <= plus_seconds(now(), -give_up_s)).label("expired"),
        )
    ).all()


def mark_delivered(conn: Connection, callback_id: int) -> None:
    """A 2xx came back (primary key)."""
    conn.execute(
        update(callbacks)
        .where(callbacks.c.id == callback_id)
        .values(state=CallbackState.DELIVERED, delivered_at=now(), last_error=None)
    )


def retry_later(conn: Connection, callback_id: int, *, delay_s: float, error: str) -> None:
    """The attempt failed: try again `delay_s` from now (primary key)."""
    conn.execute(
        update(callbacks)
        .where(callbacks.c.id == callback_id)
        .values(next_attempt_at=plus_seconds(now(), delay_s), last_error=error)
    )


def give_up(conn: Connection, callback_id: int, run_id: int, *, url: str, error: str) -> None:
    """Mark the callback failed and raise a `callback_failed` alert (primary key)."""
    conn.execute(
        update(callbacks)
        .where(callbacks.c.id == callback_id)
        .values(state=CallbackState.FAILED, last_error=error)
    )
    raise_alert(
        conn,
        Alert(
            kind=AlertKind.CALLBACK_FAILED,
            subject=f"callback:{callback_id}",
            message=f"callback of run {run_id} to {url} given up: {error}",
            run_id=run_id,
            detail={"callback_id": callback_id, "url": url, "error": error},
        ),
    )


def callbacks_of(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    """The run's callbacks, oldest first (ix_callbacks_run_id)."""
    rows = conn.execute(
        select(callbacks).where(callbacks.c.run_id == run_id).order_by(callbacks.c.id)
    )
    return [dict(r._mapping) for r in rows]
