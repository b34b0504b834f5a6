"""Operator alerts: list them, show one, acknowledge one (the functions behind the CLI)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update

from sasflow.errors import SasflowError
from sasflow.store.schema import alerts
from sasflow.store.sqltime import now


class AlertNotFoundError(SasflowError):
    """No alert with that id."""


class AlertAlreadyAcknowledgedError(SasflowError):
    """The alert was acknowledged already."""


class InvalidAcknowledgementError(SasflowError):
    """An acknowledgement needs a reason and an actor of at most 200 characters."""


ACTOR_MAX = 200


LIST_COLUMNS = (
    alerts.c.id,
    alerts.c.kind,
    alerts.c.run_id,
    alerts.c.step_id,
    alerts.c.message,
    alerts.c.acknowledged,
    alerts.c.acknowledged_by,
    alerts.c.created_at,
    alerts.c.notified_at,
)


def list_alerts(
    conn: Connection,
    *,
    include_acknowledged: bool = False,
    kind: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Alerts, newest first: open ones only unless `include_acknowledged`."""
    query = select(*LIST_COLUMNS).order_by(alerts.c.id.desc()).limit(limit)
    if not include_acknowledged:
        query = query.where(alerts.c.acknowledged.is_(False))
    if kind is not None:
        query = query.where(alerts.c.kind == kind)
    return [dict(r._mapping) for r in conn.execute(query)]


def show_alert(conn: Connection, alert_id: int) -> dict[str, Any]:
    """Every column of one alert."""
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).first()
    if row is None:
        raise AlertNotFoundError(f"no alert with id {alert_id}")
    return dict(row._mapping)


def acknowledge(conn: Connection, alert_id: int, *, actor: str, reason: str) -> dict[str, Any]:
    """Acknowledge an open alert (a new one of the same kind and subject may then be raised);
    returns the alert as it is now."""
    if not reason.strip() or not actor.strip() or len(actor) > ACTOR_MAX:
        raise InvalidAcknowledgementError
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id).with_for_update()).first()
    if row is None:
        raise AlertNotFoundError(f"no alert with id {alert_id}")
    if row.acknowledged:
        when = row.acknowledged_at.isoformat(timespec="seconds") if row.acknowledged_at else "?"
        raise AlertAlreadyAcknowledgedError(
            f"alert {alert_id} is already acknowledged (by {row.acknowledged_by} at {when}: "
            f"{row.acknowledge_reason})"
        )
    updated = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id)
        .values(
            acknowledged=True,
            acknowledged_by=actor,
            acknowledge_reason=reason,
            acknowledged_at=now(),
        )
        .returning(*alerts.c)
    ).one()
    return dict(updated._mapping)
