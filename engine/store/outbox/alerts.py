"""Alerts in the store: raise them (one open alert per subject and kind), hand them to the
dispatcher (the `alerts` table is the sinks' outbox, `notified_at` its mark), and list, show
and acknowledge them for operators."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    Select,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    text,
    update,
)

from sasflow.store.dialect import least, upsert_insert
from sasflow.store.outbox import incidents as incident_store
from sasflow.store.outbox.causes import cause_of
from sasflow.store.schema import alerts, incidents, runs
from sasflow.store.sqltime import now, plus_seconds


class AlertKind(StrEnum):
    """What an alert is about (the alert document's `kind`, docs/alerts.md)."""

    STEP_FAILED = "step_failed"
    COMPENSATION_FAILED = "compensation_failed"
    STALLED = "stalled"
    AGENT_LOST = "agent_lost"
    CALLBACK_FAILED = "callback_failed"
    """An HTTP callback was given up (sasflow api)."""
    SCHEDULER_OVERLOADED = "scheduler_overloaded"
    RUN_DEADLINE = "run_deadline"
    """A run passed its workflow's deadline (`on_deadline="alert"`, docs/timeouts.md)."""
    AGENT_OUTAGE = "agent_outage"
    """An agent had work waiting and nobody serving it for a while (supervisor.outage)."""
    BROKER_OUTAGE = "broker_outage"
    """The supervisor could not reach the broker while work waited for agents nobody has heard
    of (supervisor.broker_outage): one alert in place of one `agent_outage` per agent."""
    ACTION_MISSING = "action_missing"
    """Steps of an action deferred for a while, and no live instance of their agent says it
    has the action (supervisor.fleet): a rolling deploy that never finished, a typo."""
    AGENT_WEDGED = "agent_wedged"
    """Every worker thread of an agent instance is held by a handler past its deadline
    (supervisor.fleet): it takes no requests, and exits for a restart past its bound."""
    SUBSCRIBER_AWAY = "subscriber_away"
    """A stream subscriber has had no open stream for a while; it expires later
    (supervisor.subscribers)."""
    STEP_PARKED = "step_parked"
    """A step's failures ran out (or it answered a permanent error) and its policy parks it:
    the run waits for an operator to unpark or fail it (store.runs.parked); resolved when one
    does."""
    APPROVAL_OVERDUE = "approval_overdue"
    """An approval (`Step.approval`) waited `escalate_after` seconds without a decision: raised
    once per approval by the schedulers' event-wait duty (store.inbound.approvals), resolved
    when it is decided."""
    VERSION_MISSING = "version_missing"
    """Runs of a workflow version have waited for a while and no live scheduler has that
    version loaded (scheduler.advancing; docs/howto/upgrade.md)."""


STEP_FAILED = AlertKind.STEP_FAILED
COMPENSATION_FAILED = AlertKind.COMPENSATION_FAILED
STEP_PARKED = AlertKind.STEP_PARKED
STALLED = AlertKind.STALLED
AGENT_LOST = AlertKind.AGENT_LOST
AGENT_OUTAGE = AlertKind.AGENT_OUTAGE
AGENT_WEDGED = AlertKind.AGENT_WEDGED
ACTION_MISSING = AlertKind.ACTION_MISSING
BROKER_OUTAGE = AlertKind.BROKER_OUTAGE

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
    alerts.c.delivery_errors,
    alerts.c.retry_at,
    alerts.c.incident_id,
)
"""What `sasflow alerts list` shows of an alert."""


@dataclass(frozen=True)
class Alert:
    """Something an operator must look at."""

    kind: str
    subject: str
    """What the alert is about (a step id, an agent...): with `kind`, the deduplication key."""
    message: str
    run_id: int | None = None
    step_id: int | None = None
    detail: Any = None
    workflow: str | None = None
    """The run's workflow, when the alert is about a run: part of a failure's cause."""

    @property
    def dedup_key(self) -> str:
        return f"{self.kind}:{self.subject}"[:200]


def raise_alert(conn: Connection, alert: Alert) -> int | None:
    """Insert `alert` unless the same one is open already, counted into the open incident of
    its cause (opened if none); returns its id when it is new. Only an incident's first alert
    is left for the sinks: the others are marked notified with no sink (grouped)."""
    alert_id = _insert(conn, alert)
    if alert_id is None:
        return None
    cause = cause_of(alert.kind, alert.subject, alert.workflow, alert.detail)
    incident_id, count = incident_store.count_into(
        conn, kind=alert.kind, cause=cause, workflow=alert.workflow
    )
    values: dict[str, Any] = {"incident_id": incident_id}
    if count > 1:
        values.update(notified_at=now(), delivered_to=[])
    conn.execute(update(alerts).where(alerts.c.id == alert_id).values(**values))
    return alert_id


def _insert(conn: Connection, alert: Alert) -> int | None:
    return conn.execute(
        upsert_insert(conn, alerts)
        .values(
            kind=alert.kind,
            dedup_key=alert.dedup_key,
            message=alert.message,
            run_id=alert.run_id,
            step_id=alert.step_id,
            detail=alert.detail,
        )
        .on_conflict_do_nothing(
            index_elements=[alerts.c.dedup_key], index_where=text("NOT acknowledged")
        )
        .returning(alerts.c.id)
    ).scalar_one_or_none()


def resolve_open(
    conn: Connection, dedup_key: str, *, actor: str, reason: str, detail: Any = None
) -> bool:
    """Close the open alert with this key, the condition being over (acknowledged by `actor`;
    `detail`, when given, replaces the alert's); False when none was open
    (uq_alerts_open_dedup_key)."""
    values: dict[str, Any] = {
        "acknowledged": True,
        "acknowledged_by": actor,
        "acknowledge_reason": reason,
        "acknowledged_at": now(),
    }
    if detail is not None:
        values["detail"] = detail
    closed = conn.execute(
        update(alerts)
        .where(alerts.c.dedup_key == dedup_key, alerts.c.acknowledged.is_(False))
        .values(**values)
        .returning(alerts.c.id, alerts.c.incident_id)
    ).first()
    if closed is None:
        return False
    incident_store.close_if_done(conn, [closed.incident_id], actor=actor, reason=reason)
    return True


def open_alerts(conn: Connection, kind: str) -> list[Any]:
    """The open alerts of `kind`: id, subject (its dedup key less the kind), created_at,
    detail (the open ones are few: one per subject; a scan of uq_alerts_open_dedup_key)."""
    prefix = f"{kind}:"
    rows: Sequence[Any] = conn.execute(
        select(alerts.c.id, alerts.c.dedup_key, alerts.c.created_at, alerts.c.detail).where(
            alerts.c.kind == kind, alerts.c.acknowledged.is_(False)
        )
    ).all()
    return [r for r in rows if r.dedup_key.startswith(prefix)]


def latest_alert(conn: Connection, kind: str, subject: str) -> Any:
    """The newest alert of `kind` about `subject`, open or acknowledged: a row of
    acknowledged, created_at, detail; None if there was none (ix_alerts_dedup_key_created_at)."""
    return conn.execute(
        select(alerts.c.acknowledged, alerts.c.created_at, alerts.c.detail)
        .where(alerts.c.dedup_key == Alert(kind, subject, "").dedup_key)
        .order_by(alerts.c.created_at.desc(), alerts.c.id.desc())
        .limit(1)
    ).first()


# -- the outbox: what the dispatcher sends -------------------------------------------------


DELIVERY_GIVE_UP_S = 86_400.0
"""Seconds after an alert was raised when a sink that keeps failing is given up for it."""
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 900.0
"""A failed sink is tried again after 5 s, doubling per attempt, at most every 15 min."""


def unnotified_alerts() -> Select[Any]:
    """The oldest :limit alerts some sink has yet to take, whose retry is due, locked for one
    dispatcher (ix_alerts_unnotified), with their incident's count and cause and their run's
    workflow and business key (primary keys)."""
    return (
        select(
            alerts,
            incidents.c.alert_count.label("incident_count"),
            incidents.c.cause.label("incident_cause"),
            func.coalesce(runs.c.workflow, incidents.c.workflow).label("workflow"),
            runs.c.business_key,
        )
        .select_from(
            alerts.outerjoin(incidents, incidents.c.id == alerts.c.incident_id).outerjoin(
                runs, runs.c.id == alerts.c.run_id
            )
        )
        .where(
            alerts.c.notified_at.is_(None),
            or_(alerts.c.retry_at.is_(None), alerts.c.retry_at <= now()),
        )
        .order_by(alerts.c.id)
        .limit(bindparam("b_limit"))
        .with_for_update(skip_locked=True, of=alerts)
    )


@dataclass(frozen=True)
class Delivery:
    """What the sinks did with one alert in one dispatch."""

    alert_id: int
    delivered_to: list[str]
    """Every sink that has taken it, in this dispatch or an earlier one."""
    errors: dict[str, str]
    """Sink -> why it failed this time (empty: every sink has it now)."""


def take_unnotified(conn: Connection, *, limit: int) -> Sequence[Row[Any]]:
    """Up to `limit` alerts to send, oldest first, locked until the caller's transaction ends;
    alerts another dispatcher holds, and those waiting for a retry, are skipped."""
    return conn.execute(unnotified_alerts(), {"b_limit": limit}).all()


def record_deliveries(conn: Connection, deliveries: Sequence[Delivery]) -> list[int]:
    """Record each alert's delivery (primary key): notified once every sink took it; else a
    retry of the failed sinks after a backoff, or, past DELIVERY_GIVE_UP_S since it was raised,
    notified with the failed sinks' errors kept (given up). Returns the ids now notified."""
    attempts = alerts.c.delivery_attempts
    backoff = least(
        literal(RETRY_MAX_S), literal(RETRY_FIRST_S) * func.power(2, least(attempts, 20))
    )
    given_up = plus_seconds(alerts.c.created_at, literal(DELIVERY_GIVE_UP_S)) <= now()
    notified: list[int] = []
    for delivery in deliveries:
        values: dict[str, Any] = {
            "delivered_to": delivery.delivered_to,
            "delivery_attempts": attempts + 1,
            "delivery_errors": delivery.errors or None,
        }
        if delivery.errors:
            values["notified_at"] = case((given_up, now()), else_=None)
            values["retry_at"] = case((given_up, None), else_=plus_seconds(now(), backoff))
        else:
            values["notified_at"] = now()
            values["retry_at"] = None
        row = conn.execute(
            update(alerts)
            .where(alerts.c.id == delivery.alert_id)
            .values(**values)
            .returning(alerts.c.notified_at)
        ).first()
        if row is not None and row.notified_at is not None:
            notified.append(delivery.alert_id)
    return notified


# -- operators: list, show, acknowledge ----------------------------------------------------


def find_alerts(
    conn: Connection,
    *,
    include_acknowledged: bool,
    kind: str | None,
    limit: int,
    undelivered: bool = False,
) -> list[dict[str, Any]]:
    """The LIST_COLUMNS of up to `limit` alerts, newest first (primary key): open ones only
    unless `include_acknowledged`, of one kind when `kind` is given; with `undelivered`, only
    those a sink failed to take the last time (being retried, or given up), acknowledged or
    not (alerts are few: a walk of the primary key)."""
    query = select(*LIST_COLUMNS).order_by(alerts.c.id.desc()).limit(limit)
    if undelivered:
        query = query.where(alerts.c.delivery_errors.is_not(None))
    elif not include_acknowledged:
        query = query.where(alerts.c.acknowledged.is_(False))
    if kind is not None:
        query = query.where(alerts.c.kind == kind)
    elif not undelivered:  # notices are not alerts: listed when their kind is asked for
        query = query.where(alerts.c.kind.not_in(incident_store.NOTICE_KINDS))
    return [dict(r._mapping) for r in conn.execute(query)]


def alert_by_id(conn: Connection, alert_id: int, *, lock: bool = False) -> dict[str, Any] | None:
    """Every column of one alert (primary key), its row locked when `lock`; None if there is
    no such alert."""
    query = select(alerts).where(alerts.c.id == alert_id)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    return None if row is None else dict(row._mapping)


def set_acknowledged(conn: Connection, alert_id: int, *, actor: str, reason: str) -> dict[str, Any]:
    """Mark one alert acknowledged by `actor` for `reason` (primary key); returns every column
    as it is now. The caller has checked that the alert exists and is open."""
    row = conn.execute(
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
    incident_store.close_if_done(conn, [row.incident_id], actor=actor, reason=reason)
    return dict(row._mapping)
