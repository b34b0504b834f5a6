"""The retention of what grows on the embedded SQLite store: an away subscriber is alerted,
then expired and deleted with its updates; old audit records are pruned; `sasflow audit list`
reads the trail (the statements are portable, the database's clock is SQLite's)."""

from __future__ import annotations

import json
from datetime import timedelta

from click.testing import CliRunner
from sqlalchemy import ColumnElement, Engine, Table, select, update

from sasflow.cli.main import cli
from sasflow.ops import stream as ops
from sasflow.ops.retention import prune_audit
from sasflow.store.cluster.lease import SUPERVISOR_LEASE, Lease
from sasflow.store.db import run_transaction, transaction
from sasflow.store.operator import audit as audit_store
from sasflow.store.outbox import stream
from sasflow.store.runs.sweeps import SweepReport
from sasflow.store.schema import alerts, audit, stream_updates, subscribers
from sasflow.supervisor.subscribers import SubscriberWatch, watch_subscribers

HOUR = 3600.0


def _back(
    engine: Engine, table: Table, column: str, where: ColumnElement[bool], seconds: float
) -> None:
    """Move `column` of the rows `where` selects `seconds` into the past (database clock)."""
    with transaction(engine) as conn:
        now = audit_store.database_now(conn)
        conn.execute(update(table).where(where).values({column: now - timedelta(seconds=seconds)}))


def test_an_away_subscriber_is_alerted_then_expired_on_sqlite(sqlite_engine: Engine) -> None:
    engine = sqlite_engine
    with transaction(engine) as conn:
        subscriber, _ = ops.subscribe(
            conn,
            name="gone",
            subscriber_id=None,
            where=ops.StreamFilter(),
            owner="alice",
            namespace="ns",
        )
        feed = [stream.FeedEvent(i, "orders", None, {"run": i}) for i in range(3)]
        stream.fan_out(conn, feed, namespace="ns")
    sid = subscriber.id
    _back(engine, subscribers, "seen_at", subscribers.c.id == sid, 3 * HOUR)
    lease = Lease("test", name=SUPERVISOR_LEASE, ttl=60)
    assert lease.acquire(engine)
    watch = SubscriberWatch(alert_s=HOUR, expire_s=2 * HOUR, budget=5.0)

    first = SweepReport()
    watch_subscribers(engine, lease, watch, actor="test", report=first)
    assert (len(first.alerts), first.subscribers_expired) == (1, 0)
    _back(engine, alerts, "created_at", alerts.c.kind == "subscriber_away", HOUR + 1)
    second = SweepReport()
    watch_subscribers(engine, lease, watch, actor="test", report=second)
    assert (second.alerts, second.subscribers_expired, second.updates_deleted) == ([], 1, 3)
    with engine.connect() as conn:
        assert conn.execute(select(subscribers.c.id)).all() == []
        assert conn.execute(select(stream_updates.c.id)).all() == []
        # The away alert resolved, and its incident with it (a notice for the sinks).
        assert conn.execute(
            select(alerts.c.kind, alerts.c.acknowledged).order_by(alerts.c.id)
        ).all() == [("subscriber_away", True), ("incident_resolved", True)]


def test_old_audit_records_are_pruned_and_listed_on_sqlite(
    sqlite_engine: Engine, sqlite_url: str
) -> None:
    with transaction(sqlite_engine) as conn:
        old = audit_store.record(conn, audit_store.AuditRecord("bob", "dead.purge", "old"))
        new = audit_store.record(conn, audit_store.AuditRecord("bob", "dead.replay", "new"))
    _back(sqlite_engine, audit, "created_at", audit.c.id == old, 400 * 86400)
    done = prune_audit(sqlite_engine, 365 * 86400, actor="test")
    assert done.pruned == 1
    ids = run_transaction(sqlite_engine, lambda conn: [r["id"] for r in audit_store.recent(conn)])
    assert old not in ids
    assert new in ids
    listed = CliRunner().invoke(
        cli,
        ["audit", "list", "--action", "dead", "--since", "1h", "-o", "json"],
        env={"SASFLOW_DATABASE_URL": sqlite_url},
    )
    assert listed.exit_code == 0, listed.output
    assert [r["id"] for r in json.loads(listed.output)] == [new]
