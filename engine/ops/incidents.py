"""Incidents: alerts of one cause grouped while it lasts (docs/alerts.md#incidents). List them,
show one with its alerts, preview and acknowledge one (all its open alerts with it, one audited
action); the functions behind `sasflow alerts`, the HTTP API and the console."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sasflow.errors import (
    IncidentAlreadyAcknowledgedError,
    IncidentNotFoundError,
    InvalidAcknowledgementError,
)
from sasflow.ops.alerts import ACTOR_MAX
from sasflow.ops.reasons import REASON_MAX, has_text
from sasflow.store.db import Connection, Engine, run_transaction
from sasflow.store.operator import audit
from sasflow.store.outbox import incidents

ACK_ACTION = "incidents.ack"
"""The audit trail's name of an incident's acknowledgement."""
PRUNE_ACTION = "incidents.prune"
"""The audit trail's name of a retention pass that deleted closed incidents."""
log = logging.getLogger(__name__)

SHOWN_ALERTS = 1000
"""An incident's page shows at most this many of its alerts (the first raised)."""


def list_incidents(
    conn: Connection,
    *,
    include_acknowledged: bool = False,
    kind: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Incidents, the last seen first, each with a few of its run ids (`sample_runs`): open
    ones only unless `include_acknowledged`."""
    return incidents.find_incidents(
        conn, include_acknowledged=include_acknowledged, kind=kind, limit=limit
    )


def show_incident(
    conn: Connection, incident_id: int, *, limit: int = SHOWN_ALERTS
) -> dict[str, Any]:
    """One incident, with `open_alerts` (how many are not acknowledged) and `alerts` (up to
    `limit`, the first raised first, each with its run's workflow, business key and state;
    the resolved notice among them once it is closed)."""
    incident = incidents.incident_by_id(conn, incident_id)
    if incident is None:
        raise IncidentNotFoundError(f"no incident with id {incident_id}")
    return {
        **incident,
        "open_alerts": incidents.open_alert_count(conn, incident_id),
        "alerts": incidents.alerts_of(conn, incident_id, limit=limit),
    }


def preview(conn: Connection, incident_id: int) -> dict[str, Any]:
    """What acknowledging the incident would do: the incident and how many of its alerts are
    open (each would be acknowledged); refused as the acknowledgement itself would be."""
    incident = _open_incident(conn, incident_id, lock=False)
    return {**incident, "open_alerts": incidents.open_alert_count(conn, incident_id)}


def acknowledge(conn: Connection, incident_id: int, *, actor: str, reason: str) -> dict[str, Any]:
    """Acknowledge an open incident and every open alert of it, queue its resolved notice and
    audit the action; returns the incident as it is now, with `alerts_acknowledged`."""
    _check(actor, reason)
    # Locked: two operators at once, the second is told who was first; a raiser of the same
    # cause waits and then opens a new incident.
    _open_incident(conn, incident_id, lock=True)
    done = incidents.acknowledge(conn, incident_id, actor=actor, reason=reason)
    audit.record(
        conn,
        audit.AuditRecord(
            actor,
            ACK_ACTION,
            reason,
            detail={
                "incident_id": incident_id,
                "cause": done["cause"],
                "alerts_acknowledged": done["alerts_acknowledged"],
            },
        ),
    )
    return done


def _check(actor: str, reason: str) -> None:
    if not has_text(reason) or len(reason) > REASON_MAX:
        raise InvalidAcknowledgementError(
            f"an acknowledgement needs a reason with text, at most {REASON_MAX} characters"
        )
    if not actor.strip() or len(actor) > ACTOR_MAX:
        raise InvalidAcknowledgementError(
            f"an acknowledgement needs an actor of 1 to {ACTOR_MAX} characters"
        )


def _open_incident(conn: Connection, incident_id: int, *, lock: bool) -> dict[str, Any]:
    incident = incidents.incident_by_id(conn, incident_id, lock=lock)
    if incident is None:
        raise IncidentNotFoundError(f"no incident with id {incident_id}")
    if incident["acknowledged"]:
        at = incident["acknowledged_at"]
        when = at.isoformat(timespec="seconds") if at else "?"
        raise IncidentAlreadyAcknowledgedError(
            f"incident {incident_id} is already acknowledged (by {incident['acknowledged_by']} "
            f"at {when}: {incident['acknowledge_reason']})"
        )
    return incident


def prune_closed(
    engine: Engine,
    keep_s: float,
    *,
    actor: str,
    batch: int = 1000,
    budget: float | None = None,
    check: Callable[[Connection], None] | None = None,
) -> tuple[int, bool]:
    """Delete the incidents closed more than `keep_s` seconds ago with their notices, `batch`
    per transaction, within `budget` seconds; each transaction that deleted some writes one
    audit record (`incidents.prune`). Returns (how many, whether all due were deleted).
    `check` runs first in every transaction (the supervisor checks its lease there)."""
    deadline = None if budget is None else time.monotonic() + budget

    def one_batch(conn: Connection) -> int:
        if check is not None:
            check(conn)
        deleted = incidents.prune_closed(conn, keep_s=keep_s, batch=batch)
        if deleted:
            detail = {"pruned": deleted, "keep_days": keep_s / 86_400}
            audit.record(conn, audit.AuditRecord(actor, PRUNE_ACTION, "retention", detail))
        return deleted

    pruned = 0
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            return pruned, False
        deleted = run_transaction(engine, one_batch)
        pruned += deleted
        if deleted < batch:
            break
    if pruned:
        log.info("%s pruned %d closed incident(s)", actor, pruned)
    return pruned, True
