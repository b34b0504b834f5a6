"""The supervisor's watch over subscription-stream subscribers that went away for good.

A subscriber collects one row per matching event until it acknowledges it, so one that never
comes back would grow `stream_updates` forever. A subscriber with no open stream (its streams
refresh `seen_at` at each heartbeat) for `subscriber_alert_s` gets one `subscriber_away`
alert; for `subscriber_expire_s`, and no sooner than the difference after that alert, it is
expired in one short transaction (its stream, if any, ends; it receives nothing more and
cannot reconnect; one audit record, action `stream.expire`), then its updates are deleted in
batches and finally its row. A subscriber seen again resolves its alert. Each transaction
checks the supervisor's lease first.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from sasflow.store.cluster.lease import Lease
from sasflow.store.db import Connection, Engine, run_transaction
from sasflow.store.operator import audit
from sasflow.store.outbox import stream, stream_retention
from sasflow.store.outbox.alerts import (
    Alert,
    AlertKind,
    latest_alert,
    open_alerts,
    raise_alert,
    resolve_open,
)
from sasflow.store.outbox.stream_retention import Away
from sasflow.store.runs.sweeps import SweepReport

log = logging.getLogger(__name__)

EXPIRE_ACTION = "stream.expire"
AWAY = AlertKind.SUBSCRIBER_AWAY
PER_PASS = 100
"""Subscribers alerted, and expired, at most per pass."""
UPDATES_BATCH = 5000
"""Updates of expired subscribers deleted per transaction."""


@dataclass(frozen=True)
class SubscriberWatch:
    alert_s: float
    expire_s: float | None
    budget: float
    """Seconds the deletion of expired subscribers' updates may take per pass."""


def watch_subscribers(
    engine: Engine, lease: Lease, watch: SubscriberWatch, *, actor: str, report: SweepReport
) -> None:
    """Resolve the alerts of subscribers seen again, alert the newly away, expire those away
    past their expiry, and delete what expired subscribers left (within the budget)."""

    def alerts(conn: Connection) -> list[int]:
        lease.check(conn)
        _resolve_returned(conn, actor)
        raised = []
        for away in stream_retention.away_longer_than(conn, watch.alert_s, limit=PER_PASS):
            alert_id = _alert(conn, away, watch, actor)
            if alert_id is not None:
                raised.append(alert_id)
        return raised

    report.alerts.extend(run_transaction(engine, alerts))
    expire_s = watch.expire_s
    if expire_s is not None:
        due = run_transaction(
            engine, lambda conn: stream_retention.away_longer_than(conn, expire_s, limit=PER_PASS)
        )
        for away in due:
            expire = functools.partial(_expire, lease=lease, away=away, watch=watch, actor=actor)
            report.subscribers_expired += run_transaction(engine, expire)
    _delete_expired(engine, lease, watch.budget, report)


def _resolve_returned(conn: Connection, actor: str) -> None:
    """Close the open alerts of subscribers seen since (or gone: torn down or expired)."""
    opened = {r.dedup_key.split(":", 1)[1]: r for r in open_alerts(conn, AWAY)}
    seen = stream_retention.seen_since(conn, sorted(opened))
    for subscriber_id, alert in opened.items():
        last = seen.get(subscriber_id)
        if last is None:
            reason = "the subscriber is gone (torn down)"
        elif last > alert.created_at:
            reason = "the subscriber opened a stream again"
        else:
            continue
        resolve_open(conn, alert.dedup_key, actor=actor, reason=reason)
        log.info("subscriber %s: %s; its %s alert is resolved", subscriber_id, reason, AWAY)


def _alert(conn: Connection, away: Away, watch: SubscriberWatch, actor: str) -> int | None:
    """One alert per absence: none if one was raised since it was last seen. Returns the new
    alert's id."""
    last = latest_alert(conn, AWAY, away.id)
    if last is not None and last.created_at >= away.seen_at:
        return None
    pending = stream.pending_count(conn, away.id)
    if watch.expire_s is not None:
        # No sooner than the rest of the expiry after this alert, whatever its absence so far.
        left = max(watch.expire_s - away.away_s, watch.expire_s - watch.alert_s)
        then = f"it will be deleted with them in {_duration(left)}"
    else:
        then = "it is kept (no expiry)"
    message = (
        f"stream subscriber {away.name!r} ({away.id}) of token {away.owner!r} has had no open "
        f"stream for {_duration(away.away_s)} and {pending} update(s) not acknowledged; "
        f"{then} unless it reconnects (or TEARDOWN it)"
    )
    detail = {
        "subscriber_id": away.id,
        "name": away.name,
        "owner": away.owner,
        "seen_at": away.seen_at.isoformat(),
        "pending": pending,
        "expire_after_s": watch.expire_s,
        "reported_by": actor,
    }
    alert_id = raise_alert(conn, Alert(AWAY, away.id, message, detail=detail))
    if alert_id is not None:
        log.warning("%s", message)
    return alert_id


def _expire(
    conn: Connection, *, lease: Lease, away: Away, watch: SubscriberWatch, actor: str
) -> bool:
    """Expire `away` if its alert was raised during this absence long enough ago; returns
    whether it did."""
    lease.check(conn)
    last = latest_alert(conn, AWAY, away.id)
    if last is None or last.created_at < away.seen_at:
        return False  # not alerted during this absence yet: the alert comes first
    warned_for = (audit.database_now(conn) - last.created_at).total_seconds()
    if watch.expire_s is None or warned_for < watch.expire_s - watch.alert_s:
        return False
    pending = stream.pending_count(conn, away.id)
    if not stream_retention.expire(conn, away.id, seen_before=away.seen_at):
        return False  # seen meanwhile, or expired by another pass
    detail = {
        "subscriber_id": away.id,
        "name": away.name,
        "owner": away.owner,
        "seen_at": away.seen_at.isoformat(),
        "away_s": round(away.away_s, 3),
        "pending_deleted": pending,
    }
    reason = f"no open stream for {_duration(away.away_s)} (retention)"
    audit.record(conn, audit.AuditRecord(actor, EXPIRE_ACTION, reason, detail=detail))
    resolve_open(
        conn,
        Alert(AWAY, away.id, "").dedup_key,
        actor=actor,
        reason=f"expired: deleted with its {pending} update(s) not acknowledged",
    )
    log.warning(
        "%s expired stream subscriber %r (%s) of token %r: %s; %d update(s) not acknowledged "
        "are deleted",
        actor,
        away.name,
        away.id,
        away.owner,
        reason,
        pending,
    )
    return True


def _delete_expired(engine: Engine, lease: Lease, budget: float, report: SweepReport) -> None:
    """Delete expired subscribers' updates, a batch per transaction, then the subscribers
    left with none."""
    until = time.monotonic() + budget

    def batch(conn: Connection) -> int:
        lease.check(conn)
        return stream_retention.delete_expired_updates(conn, batch=UPDATES_BATCH)

    def emptied(conn: Connection) -> int:
        lease.check(conn)
        return stream_retention.delete_emptied(conn)

    while True:
        deleted = run_transaction(engine, batch)
        report.updates_deleted += deleted
        if deleted < UPDATES_BATCH:
            break
        if time.monotonic() >= until:
            return  # the rest in the next pass
    run_transaction(engine, emptied)


def _duration(seconds: float) -> str:
    """3d 4h, 5h 12m, 7m: what an operator reads in an alert."""
    seconds = max(0.0, seconds)
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m" if minutes else f"{int(seconds)}s"
