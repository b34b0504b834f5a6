"""Stream subscribers that went away, on PostgreSQL: the supervisor alerts one away past the
alert delay, expires it (audited, its updates deleted in batches) no sooner than the rest of
the expiry after that alert, resolves the alert of one that came back or was torn down; an
expired subscriber receives nothing and cannot reconnect; an open stream refreshes when its
subscriber was seen at each heartbeat."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from typing import Any, cast

import pytest
from sqlalchemy import Engine, func, select, text, update

from sasflow.api.stream.hub import StreamHub, StreamOptions
from sasflow.errors import SubscriberNotFoundError
from sasflow.ops import stream as ops
from sasflow.ops.retention import GrowthRetention
from sasflow.recordio import Decoder
from sasflow.store.cluster.lease import SUPERVISOR_LEASE, Lease
from sasflow.store.db import transaction
from sasflow.store.outbox import stream, stream_retention
from sasflow.store.runs.sweeps import SweepReport
from sasflow.store.schema import alerts, audit, stream_updates, subscribers
from sasflow.supervisor import subscribers as watch
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

HOUR = 3600.0
GROWTH = GrowthRetention(subscriber_alert_s=HOUR, subscriber_expire_s=2 * HOUR)


@pytest.fixture
def supervisor(engine: Engine, names: Names) -> Iterator[Supervisor]:
    role = Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(growth=GROWTH, prune_interval=0),
    )
    yield role
    role.close()


def _subscribe(engine: Engine, names: Names, name: str, sid: str | None = None) -> tuple[str, str]:
    with transaction(engine) as conn:
        subscriber, stream_id = ops.subscribe(
            conn,
            name=name,
            subscriber_id=sid,
            where=ops.StreamFilter(),
            owner="alice",
            namespace=names.namespace,
        )
    return subscriber.id, stream_id


def _updates(engine: Engine, names: Names, count: int) -> None:
    """`count` events fanned out to every live subscriber (as the relay does)."""
    feed = [
        stream.FeedEvent(run_id=i, workflow="orders", submitted_by=None, body={"run": i})
        for i in range(count)
    ]
    with transaction(engine) as conn:
        stream.fan_out(conn, feed, namespace=names.namespace)


def _seen_ago(engine: Engine, sid: str, seconds: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(subscribers)
            .where(subscribers.c.id == sid)
            .values(seen_at=func.now() - text(f"interval '{seconds} seconds'"))
        )


def _alert_ago(engine: Engine, sid: str, seconds: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(alerts)
            .where(alerts.c.dedup_key == f"subscriber_away:{sid}")
            .values(created_at=func.now() - text(f"interval '{seconds} seconds'"))
        )


def _alerts(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(alerts).where(alerts.c.kind == "subscriber_away").order_by(alerts.c.id)
            )
        )


def _pending(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(stream_updates.c.subscriber_id, func.count()).group_by(
                stream_updates.c.subscriber_id
            )
        )
        return {str(sid): int(count) for sid, count in rows}


def _subscriber_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(subscribers.c.id)).scalars())


def _sweep(supervisor: Supervisor) -> Any:
    report = supervisor.sweep_once()
    assert report is not None
    return report


def test_an_away_subscriber_is_alerted_then_expired_with_its_updates_and_audited(
    engine: Engine, names: Names, supervisor: Supervisor
) -> None:
    gone, _ = _subscribe(engine, names, "gone-for-good")
    here, _ = _subscribe(engine, names, "connected")
    late, _ = _subscribe(engine, names, "late")
    _updates(engine, names, 5)
    _seen_ago(engine, gone, 2 * HOUR + 60)  # past its expiry already
    _seen_ago(engine, late, 1.5 * HOUR)  # past the alert only

    first = _sweep(supervisor)
    raised = _alerts(engine)
    assert sorted(a.dedup_key for a in raised) == sorted(
        [f"subscriber_away:{gone}", f"subscriber_away:{late}"]
    )
    assert sorted(first.alerts) == sorted(a.id for a in raised)
    (about_gone,) = [a for a in raised if a.dedup_key.endswith(gone)]
    assert about_gone.detail["pending"] == 5
    assert about_gone.detail["name"] == "gone-for-good"
    assert (
        "has had no open stream for 2h 1m and 5 update(s) not acknowledged; it will be "
        "deleted with them in 1h 0m unless it reconnects" in (about_gone.message)
    )
    # The alert comes first: past its expiry, but alerted just now, it waits.
    assert first.subscribers_expired == 0
    assert _subscriber_ids(engine) == {gone, here, late}

    _alert_ago(engine, gone, HOUR - 60)
    assert _sweep(supervisor).subscribers_expired == 0  # not yet expiry - alert after it
    _alert_ago(engine, gone, HOUR + 1)
    second = _sweep(supervisor)
    assert (second.subscribers_expired, second.updates_deleted) == (1, 5)
    assert second.alerts == []  # `late` was alerted in this absence already
    assert _subscriber_ids(engine) == {here, late}
    assert _pending(engine) == {here: 5, late: 5}
    with engine.connect() as conn:
        (record,) = conn.execute(select(audit).where(audit.c.action == "stream.expire")).all()
        resolved = conn.execute(select(alerts).where(alerts.c.id == about_gone.id)).one()
    assert record.actor == supervisor.id
    assert record.detail["subscriber_id"] == gone
    assert record.detail["pending_deleted"] == 5
    assert record.reason.startswith("no open stream for 2h")
    assert resolved.acknowledged
    assert resolved.acknowledge_reason == "expired: deleted with its 5 update(s) not acknowledged"
    with pytest.raises(SubscriberNotFoundError), transaction(engine) as conn:
        ops.subscribe(
            conn,
            name="back",
            subscriber_id=gone,
            where=ops.StreamFilter(),
            owner="alice",
            namespace=names.namespace,
        )


def test_a_subscriber_seen_again_resolves_its_alert_and_a_new_absence_alerts_again(
    engine: Engine, names: Names, supervisor: Supervisor
) -> None:
    sid, _ = _subscribe(engine, names, "flaky")
    _seen_ago(engine, sid, 1.5 * HOUR)
    _sweep(supervisor)
    (alert,) = _alerts(engine)
    _alert_ago(engine, sid, 10 * HOUR)
    _subscribe(engine, names, "flaky", sid)  # reconnects: seen now
    assert _sweep(supervisor).subscribers_expired == 0
    (resolved,) = _alerts(engine)
    assert resolved.acknowledged
    assert resolved.acknowledge_reason == "the subscriber opened a stream again"
    assert sid in _subscriber_ids(engine)

    _seen_ago(engine, sid, 1.5 * HOUR)
    report = _sweep(supervisor)
    first, second = _alerts(engine)
    assert first.id == alert.id
    assert (second.acknowledged, report.alerts) == (False, [second.id])


def test_a_torn_down_subscriber_resolves_its_alert(
    engine: Engine, names: Names, supervisor: Supervisor
) -> None:
    sid, stream_id = _subscribe(engine, names, "leaving")
    _seen_ago(engine, sid, 1.5 * HOUR)
    _sweep(supervisor)
    with transaction(engine) as conn:
        ops.teardown(conn, stream_id, owner="alice", namespace=names.namespace)
    _sweep(supervisor)
    (alert,) = _alerts(engine)
    assert alert.acknowledged
    assert alert.acknowledge_reason == "the subscriber is gone (torn down)"


def test_an_expired_subscriber_receives_nothing_and_its_updates_go_in_batches(
    engine: Engine, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, stream_id = _subscribe(engine, names, "expiring")
    other, _ = _subscribe(engine, names, "staying")
    _updates(engine, names, 7)
    with transaction(engine) as conn:
        (away,) = [a for a in stream_retention.away_longer_than(conn, -1, limit=10) if a.id == sid]
        assert stream_retention.expire(conn, sid, seen_before=away.seen_at)
        assert not stream_retention.expire(conn, sid, seen_before=away.seen_at)  # once
    with transaction(engine) as conn:
        assert not stream.lock_if_current(conn, sid, stream_id)  # its stream ends
        assert [s.id for s in stream.all_subscribers(conn)] == [other]
    _updates(engine, names, 2)  # fanned out to the live one only
    assert _pending(engine) == {sid: 7, other: 9}

    monkeypatch.setattr(watch, "UPDATES_BATCH", 3)
    report = SweepReport()
    lease = _lease(engine)
    watch._delete_expired(engine, lease, 0.0, report)  # budget spent: one batch, the rest later
    assert report.updates_deleted == 3
    assert sid in _subscriber_ids(engine)
    watch._delete_expired(engine, lease, 60.0, report)
    assert report.updates_deleted == 7
    assert _subscriber_ids(engine) == {other}
    assert _pending(engine) == {other: 9}


def test_a_subscriber_seen_since_its_away_read_is_not_expired(engine: Engine, names: Names) -> None:
    sid, _ = _subscribe(engine, names, "back-in-time")
    with transaction(engine) as conn:
        (away,) = stream_retention.away_longer_than(conn, -1, limit=10)
    time.sleep(0.01)
    with transaction(engine) as conn:
        stream.touch(conn, sid)
    with transaction(engine) as conn:
        assert not stream_retention.expire(conn, sid, seen_before=away.seen_at)


def test_an_open_stream_refreshes_when_its_subscriber_was_seen(
    engine: Engine, database_url: str, names: Names
) -> None:
    sid, stream_id = _subscribe(engine, names, "watching")
    _seen_ago(engine, sid, HOUR)
    hub = StreamHub(engine, database_url, names.namespace, StreamOptions(heartbeat_interval=0.05))
    hub.start()
    records = cast(Generator[bytes, None, None], hub.records(sid, stream_id))  # to close it
    decoder = Decoder()
    try:
        kinds = []
        for chunk in records:
            kinds += [r["type"] for r in decoder.feed(chunk)]
            if kinds.count("HEARTBEAT") == 2:
                break
    finally:
        records.close()
        hub.close()
    with transaction(engine) as conn:
        assert stream_retention.away_longer_than(conn, 60, limit=10) == []


def _lease(engine: Engine) -> Lease:
    lease = Lease("test-retention", name=SUPERVISOR_LEASE, ttl=60)
    assert lease.acquire(engine)
    return lease
