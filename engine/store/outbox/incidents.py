"""Incidents in the store: alerts of one cause grouped while the incident is open
(docs/alerts.md#incidents).

An alert raised (`alerts.raise_alert`) counts into the open incident of its cause, or opens
one. Only an incident's first alert goes to the sinks; the others are recorded, counted and
marked notified at once (`delivered_to` empty: grouped). An incident closes when an operator
acknowledges it (all its open alerts with it) or when its last open alert is acknowledged
(the run resubmitted or cancelled, the condition over, an alert acknowledged alone); closing
writes an `incident_resolved` notice into the alerts outbox, in the same transaction, which
the dispatcher sends to every sink like an alert.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, delete, exists, func, literal, select, text, update

from sasflow.store.dialect import upsert_insert
from sasflow.store.outbox.causes import Cause
from sasflow.store.schema import alerts, incidents, runs
from sasflow.store.sqltime import now, plus_seconds

RESOLVED = "incident_resolved"
"""The kind of the notice an incident's closing sends (an alerts row born acknowledged)."""
ONGOING = "incident_ongoing"
"""The kind of the notice that an open incident is still counting alerts (a reminder)."""
NOTICE_KINDS = (RESOLVED, ONGOING)
"""Kinds that are notices about an incident, not alerts: never open, listed only on request."""
SAMPLE_RUNS = 5
"""How many of an incident's runs its listing names."""

LIST_COLUMNS = (
    incidents.c.id,
    incidents.c.kind,
    incidents.c.cause,
    incidents.c.workflow,
    incidents.c.alert_count,
    incidents.c.first_seen,
    incidents.c.last_seen,
    incidents.c.acknowledged,
    incidents.c.acknowledged_by,
    incidents.c.acknowledge_reason,
    incidents.c.acknowledged_at,
)


def count_into(
    conn: Connection, *, kind: str, cause: Cause, workflow: str | None
) -> tuple[int, int]:
    """Count one alert into the open incident of `cause`, opening it if there is none;
    returns (incident id, its count now): a count of 1 is a new incident
    (uq_incidents_open_cause_key). Concurrent raisers of one cause queue on its row."""
    row = conn.execute(
        upsert_insert(conn, incidents)
        .values(kind=kind, cause_key=cause.key, cause=cause.text, workflow=workflow)
        .on_conflict_do_update(
            index_elements=[incidents.c.cause_key],
            index_where=text("NOT acknowledged"),
            set_={
                "alert_count": incidents.c.alert_count + 1,
                "last_seen": now(),
            },
        )
        .returning(incidents.c.id, incidents.c.alert_count)
    ).one()
    return int(row.id), int(row.alert_count)


def close_if_done(
    conn: Connection, incident_ids: Iterable[int | None], *, actor: str, reason: str
) -> list[int]:
    """Close each of these incidents that is open and has no open alert left (the condition is
    over: `recovered`), with a resolved notice; returns the ids closed (ix_alerts_incident_id)."""
    ids = sorted({i for i in incident_ids if i is not None})
    if not ids:
        return []
    # Locked first, looked at after: a raiser counting an alert into one of them holds its row
    # until it commits, and the next statement's snapshot then sees that alert open. (Checked
    # in the UPDATE alone, the re-check after the wait would not see it: READ COMMITTED.)
    ids = list(
        conn.execute(
            select(incidents.c.id)
            .where(incidents.c.id.in_(ids), incidents.c.acknowledged.is_(False))
            .order_by(incidents.c.id)
            .with_for_update()
        ).scalars()
    )
    if not ids:
        return []
    still_open = exists().where(
        alerts.c.incident_id == incidents.c.id, alerts.c.acknowledged.is_(False)
    )
    closed = conn.execute(
        update(incidents)
        .where(incidents.c.id.in_(ids), incidents.c.acknowledged.is_(False), ~still_open)
        .values(
            acknowledged=True,
            acknowledged_by=actor,
            acknowledge_reason=reason,
            acknowledged_at=now(),
        )
        .returning(*LIST_COLUMNS)
    ).all()
    for row in closed:
        write_resolved(conn, dict(row._mapping), resolution="recovered")
    return [row.id for row in closed]


def acknowledge(conn: Connection, incident_id: int, *, actor: str, reason: str) -> dict[str, Any]:
    """Acknowledge an open incident and all its open alerts, and queue its resolved notice;
    returns the incident as it is now with `alerts_acknowledged`. The caller has checked
    that it exists and is open (primary key, ix_alerts_incident_id)."""
    values = {
        "acknowledged": True,
        "acknowledged_by": actor,
        "acknowledge_reason": reason,
        "acknowledged_at": now(),
    }
    acked = conn.execute(
        update(alerts)
        .where(alerts.c.incident_id == incident_id, alerts.c.acknowledged.is_(False))
        .values(**values)
    ).rowcount
    row = conn.execute(
        update(incidents)
        .where(incidents.c.id == incident_id)
        .values(**values)
        .returning(*LIST_COLUMNS)
    ).one()
    incident = dict(row._mapping)
    write_resolved(conn, incident, resolution="acknowledged")
    return {**incident, "alerts_acknowledged": acked}


def write_resolved(conn: Connection, incident: dict[str, Any], *, resolution: str) -> int:
    """Queue the notice that `incident` is resolved: an alerts row of kind incident_resolved,
    born acknowledged (never open) and not yet notified, so the dispatcher sends it."""
    how = (
        f"acknowledged by {incident['acknowledged_by']}: {incident['acknowledge_reason']}"
        if resolution == "acknowledged"
        else f"no alert of it is open any more ({incident['acknowledge_reason']})"
    )
    message = (
        f"incident {incident['id']} resolved after {incident['alert_count']} alert(s), "
        f"{how}: {incident['cause']}"
    )
    detail = {
        "incident_id": incident["id"],
        "resolution": resolution,
        "by": incident["acknowledged_by"],
        "reason": incident["acknowledge_reason"],
        "count": incident["alert_count"],
        "cause": incident["cause"],
        "first_seen": incident["first_seen"].isoformat(),
        "last_seen": incident["last_seen"].isoformat(),
    }
    return _notice(
        conn,
        RESOLVED,
        incident,
        message,
        detail,
        actor=incident["acknowledged_by"],
        reason=incident["acknowledge_reason"],
    )


def queue_reminders(conn: Connection, every_s: float, *, limit: int = 100) -> list[int]:
    """Queue an incident_ongoing notice for each open incident that counted alerts since it was
    last told to the sinks (its first alert sent, or its last reminder) at least `every_s`
    seconds ago; returns the notices' ids. Incidents another dispatcher holds are skipped
    (open incidents are few: a scan of them, ix_alerts_incident_id for each one's first)."""
    first_sent = (
        select(alerts.c.notified_at)
        .where(alerts.c.incident_id == incidents.c.id)
        .order_by(alerts.c.id)
        .limit(1)
        .scalar_subquery()
    )
    told = func.coalesce(incidents.c.reminded_at, first_sent)
    due = conn.execute(
        select(*LIST_COLUMNS, told.label("told"))
        .where(
            incidents.c.acknowledged.is_(False),
            told.is_not(None),
            plus_seconds(told, literal(every_s)) <= now(),
            incidents.c.last_seen > told,
        )
        .order_by(incidents.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=incidents)
    ).all()
    queued: list[int] = []
    for row in due:
        incident = dict(row._mapping)
        since = conn.execute(
            select(func.count())
            .select_from(alerts)
            .where(
                alerts.c.incident_id == incident["id"],
                alerts.c.created_at > incident["told"],
                alerts.c.kind.not_in(NOTICE_KINDS),
            )
        ).scalar_one()
        message = (
            f"incident {incident['id']} still happening: {incident['alert_count']} alert(s), "
            f"{since} since it was last told, the last at "
            f"{incident['last_seen'].isoformat(timespec='seconds')}: {incident['cause']}"
        )
        detail = {
            "incident_id": incident["id"],
            "count": incident["alert_count"],
            "since_last_notice": since,
            "cause": incident["cause"],
            "first_seen": incident["first_seen"].isoformat(),
            "last_seen": incident["last_seen"].isoformat(),
            "last_notice": incident["told"].isoformat(),
        }
        queued.append(_notice(conn, ONGOING, incident, message, detail, actor="sasflow"))
        conn.execute(
            update(incidents).where(incidents.c.id == incident["id"]).values(reminded_at=now())
        )
    return queued


def _notice(
    conn: Connection,
    kind: str,
    incident: dict[str, Any],
    message: str,
    detail: Any,
    *,
    actor: str,
    reason: str = "a notice, never open",
) -> int:
    """An alerts row for the sinks about `incident`: born acknowledged (never open, never
    listed as an alert), not yet notified."""
    return int(
        conn.execute(
            alerts.insert()
            .values(
                kind=kind,
                dedup_key=f"{kind}:{incident['id']}",
                message=message,
                detail=detail,
                incident_id=incident["id"],
                acknowledged=True,
                acknowledged_by=actor,
                acknowledge_reason=reason,
                acknowledged_at=now(),
            )
            .returning(alerts.c.id)
        ).scalar_one()
    )


def prune_closed(conn: Connection, *, keep_s: float, batch: int) -> int:
    """Delete up to `batch` incidents closed more than `keep_s` seconds ago, the oldest first,
    with their notices (their alerts, if their runs are still kept, lose only the link);
    incidents another pass holds are skipped; returns how many (a scan of the incidents: far
    fewer than alerts)."""
    ids = list(
        conn.execute(
            select(incidents.c.id)
            .where(
                incidents.c.acknowledged.is_(True),
                plus_seconds(incidents.c.acknowledged_at, literal(keep_s)) <= now(),
            )
            .order_by(incidents.c.id)
            .limit(batch)
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    if not ids:
        return 0
    conn.execute(
        delete(alerts).where(alerts.c.incident_id.in_(ids), alerts.c.kind.in_(NOTICE_KINDS))
    )
    conn.execute(delete(incidents).where(incidents.c.id.in_(ids)))
    return len(ids)


# -- operators: list, show -----------------------------------------------------------------


def find_incidents(
    conn: Connection, *, include_acknowledged: bool, kind: str | None, limit: int
) -> list[dict[str, Any]]:
    """The LIST_COLUMNS of up to `limit` incidents, the last seen first, each with up to
    SAMPLE_RUNS of its run ids (`sample_runs`): open ones only unless `include_acknowledged`
    (incidents are few: a sort of the open ones, or of all)."""
    query = (
        select(*LIST_COLUMNS)
        .order_by(incidents.c.last_seen.desc(), incidents.c.id.desc())
        .limit(limit)
    )
    if not include_acknowledged:
        query = query.where(incidents.c.acknowledged.is_(False))
    if kind is not None:
        query = query.where(incidents.c.kind == kind)
    found = [dict(r._mapping) for r in conn.execute(query)]
    samples = sample_runs(conn, [i["id"] for i in found])
    for incident in found:
        incident["sample_runs"] = samples.get(incident["id"], [])
    return found


def sample_runs(conn: Connection, incident_ids: Sequence[int]) -> dict[int, list[int]]:
    """Up to SAMPLE_RUNS run ids of each incident, the first alerted first
    (ix_alerts_incident_id)."""
    if not incident_ids:
        return {}
    ranked = (
        select(
            alerts.c.incident_id,
            alerts.c.run_id,
            func.row_number()
            .over(partition_by=alerts.c.incident_id, order_by=alerts.c.id)
            .label("n"),
        )
        .where(alerts.c.incident_id.in_(incident_ids), alerts.c.run_id.is_not(None))
        .subquery()
    )
    rows = conn.execute(
        select(ranked.c.incident_id, ranked.c.run_id)
        .where(ranked.c.n <= SAMPLE_RUNS)
        .order_by(ranked.c.incident_id, ranked.c.n)
    ).all()
    samples: dict[int, list[int]] = {}
    for row in rows:
        samples.setdefault(row.incident_id, []).append(row.run_id)
    return samples


def incident_by_id(
    conn: Connection, incident_id: int, *, lock: bool = False
) -> dict[str, Any] | None:
    """The LIST_COLUMNS of one incident (primary key), its row locked when `lock`; None if
    there is no such incident."""
    query = select(*LIST_COLUMNS).where(incidents.c.id == incident_id)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    return None if row is None else dict(row._mapping)


def alerts_of(conn: Connection, incident_id: int, *, limit: int) -> list[dict[str, Any]]:
    """Up to `limit` alerts of one incident, the first raised first, notices included, each
    with its run's workflow and business key (ix_alerts_incident_id)."""
    rows = conn.execute(
        select(
            alerts.c.id,
            alerts.c.kind,
            alerts.c.run_id,
            alerts.c.step_id,
            alerts.c.message,
            alerts.c.acknowledged,
            alerts.c.acknowledged_by,
            alerts.c.created_at,
            alerts.c.notified_at,
            runs.c.workflow,
            runs.c.business_key,
            runs.c.state.label("run_state"),
        )
        .select_from(alerts.outerjoin(runs, runs.c.id == alerts.c.run_id))
        .where(alerts.c.incident_id == incident_id)
        .order_by(alerts.c.id)
        .limit(limit)
    ).all()
    return [dict(r._mapping) for r in rows]


def open_alert_count(conn: Connection, incident_id: int) -> int:
    """How many alerts of the incident are open (ix_alerts_incident_id)."""
    return int(
        conn.execute(
            select(func.count())
            .select_from(alerts)
            .where(alerts.c.incident_id == incident_id, alerts.c.acknowledged.is_(False))
        ).scalar_one()
    )
