"""Apply a batch of agent replies in one transaction, each fenced by its step's attempt."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sqlalchemy import Connection, Select, Update

from sasflow.messages import Reply
from sasflow.registry import Registry
from sasflow.store import events, queries
from sasflow.store.advance import advance_runs
from sasflow.store.notify import notify_ready

log = logging.getLogger(__name__)


@dataclass
class ApplyReport:
    """How many replies were applied, and which were dropped (stale or duplicate)."""

    applied: int = 0
    dropped: list[Reply] = field(default_factory=list)
    ready: int = 0
    backing_off: int = 0
    """Steps back to pending after a counted failure or a deferral, ready after a backoff."""


@cache
def _statements() -> dict[str, Update]:
    return {
        "ok": queries.complete_step(),
        "error": queries.fail_step(),
        "deferred": queries.defer_step(),
        "failure": queries.count_failure(),
    }


@cache
def _lock_runs() -> Select[Any]:
    return queries.lock_runs_of_steps()


def apply_replies(
    conn: Connection,
    registry: Registry,
    replies: Sequence[Reply],
    *,
    namespace: str,
    actor: str,
) -> ApplyReport:
    """Apply `replies` inside the caller's transaction; the caller commits, then acks."""
    report = ApplyReport()
    if not replies:
        return report
    locked = conn.execute(_lock_runs(), {"b_step_ids": sorted({r.step_id for r in replies})}).all()
    stmts = _statements()
    batch: list[events.Event] = []
    touched: set[int] = set()
    for reply in replies:
        fence = {"b_step_id": reply.step_id, "b_attempt": reply.attempt}
        error = reply.error.model_dump() if reply.error else None
        if reply.status == "ok":
            row = conn.execute(stmts["ok"], {**fence, "b_output": reply.output}).first()
            to_state = "processed"
        elif reply.status == "error":
            row = conn.execute(stmts["error"], {**fence, "b_error": error}).first()
            to_state = "error"
        elif reply.status == "failed":
            row = conn.execute(stmts["failure"], {**fence, "b_error": error}).first()
            to_state = row.state if row is not None else "pending"
        else:
            row = conn.execute(
                stmts["deferred"],
                {**fence, "b_defer_seconds": reply.defer_seconds, "b_error": error},
            ).first()
            to_state = "pending"
            if row is None:
                # Past its give-up age (or stale): an open breaker now counts as a failure.
                gave_up = {
                    "type": "GaveUp",
                    "message": "dependency unavailable past the step's give-up age",
                }
                failure = conn.execute(stmts["failure"], {**fence, "b_error": gave_up}).first()
                if failure is not None:
                    row, to_state = failure, failure.state
        if row is None:
            log.info(
                "dropped stale or duplicate reply for step %s attempt %s (%s)",
                reply.step_id,
                reply.attempt,
                reply.status,
            )
            report.dropped.append(reply)
            continue
        report.applied += 1
        report.backing_off += to_state == "pending"
        touched.add(row.run_id)
        batch.append(
            events.Event(
                run_id=row.run_id,
                entity="step",
                step_id=reply.step_id,
                step=row.name,
                from_state="processing",
                to_state=to_state,
                attempt=reply.attempt,
                actor=actor,
                reason=reply.status if reply.status != "ok" else None,
                detail={"error": error, "agent": reply.agent} if error else None,
            )
        )
    advanced = advance_runs(conn, registry, touched, actor=actor, locked=locked)
    batch.extend(advanced.events)
    events.record(conn, batch)
    report.ready = advanced.ready
    if advanced.ready:
        notify_ready(conn, namespace)
    return report
