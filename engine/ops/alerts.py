"""Operator alerts: list them, show one, acknowledge one (the functions behind the CLI)."""

from __future__ import annotations

from typing import Any

from sasflow.errors import (
    AlertAlreadyAcknowledgedError,
    AlertNotFoundError,
    InvalidAcknowledgementError,
)
from sasflow.ops.reasons import has_text
from sasflow.store.db import Connection
from sasflow.store.outbox import alerts

ACTOR_MAX = 200


def list_alerts(
    conn: Connection,
    *,
    include_acknowledged: bool = False,
    kind: str | None = None,
    limit: int = 100,
    undelivered: bool = False,
) -> list[dict[str, Any]]:
    """Alerts, newest first: open ones only unless `include_acknowledged`; with
    `undelivered`, those a sink failed to take (retried, or given up), acknowledged or not."""
    return alerts.find_alerts(
        conn,
        include_acknowledged=include_acknowledged,
        kind=kind,
        limit=limit,
        undelivered=undelivered,
    )


def show_alert(conn: Connection, alert_id: int) -> dict[str, Any]:
    """Every column of one alert."""
    alert = alerts.alert_by_id(conn, alert_id)
    if alert is None:
        raise AlertNotFoundError(f"no alert with id {alert_id}")
    return alert


def acknowledge(conn: Connection, alert_id: int, *, actor: str, reason: str) -> dict[str, Any]:
    """Acknowledge an open alert (a new one of the same kind and subject may then be raised);
    returns the alert as it is now."""
    if not has_text(reason):
        raise InvalidAcknowledgementError(
            "an acknowledgement needs a reason with text (not only blanks or control characters)"
        )
    if not actor.strip() or len(actor) > ACTOR_MAX:
        raise InvalidAcknowledgementError(
            f"an acknowledgement needs an actor of 1 to {ACTOR_MAX} characters"
        )
    # Locked: two operators acknowledging at once, the second is told who was first.
    alert = alerts.alert_by_id(conn, alert_id, lock=True)
    if alert is None:
        raise AlertNotFoundError(f"no alert with id {alert_id}")
    if alert["acknowledged"]:
        at = alert["acknowledged_at"]
        when = at.isoformat(timespec="seconds") if at else "?"
        raise AlertAlreadyAcknowledgedError(
            f"alert {alert_id} is already acknowledged (by {alert['acknowledged_by']} at {when}: "
            f"{alert['acknowledge_reason']})"
        )
    return alerts.set_acknowledged(conn, alert_id, actor=actor, reason=reason)
