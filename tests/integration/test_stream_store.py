"""The subscription stream's durable side on PostgreSQL: the relay fans events out by filter,
a stream takes what is due on it, a reconnection re-sends exactly the unacknowledged updates,
and a stale stream's calls are refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sasflow.errors import StaleStreamError
from sasflow.ops import stream as ops
from sasflow.store.db import transaction
from sasflow.store.outbox import stream
from sasflow.transport.topology import Names
from tests.stream_feed import Feed, feeding

pytestmark = pytest.mark.integration


@pytest.fixture
def feed(engine: Engine, names: Names) -> Iterator[Feed]:
    with feeding(engine, names) as feed:
        yield feed


def _subscribe(
    engine: Engine, names: Names, owner: str, where: ops.StreamFilter, sid: str | None = None
) -> tuple[str, str]:
    with transaction(engine) as conn:
        subscriber, stream_id = ops.subscribe(
            conn,
            name="test",
            subscriber_id=sid,
            where=where,
            owner=owner,
            namespace=names.namespace,
        )
    return subscriber.id, stream_id


def _take(engine: Engine, sid: str, stream_id: str, resend_after: float = 60) -> list[stream.Due]:
    with transaction(engine) as conn:
        assert stream.lock_if_current(conn, sid, stream_id)
        return stream.take_due(conn, sid, stream_id, resend_after=resend_after, limit=1000)


def test_the_relay_fans_events_out_by_filter(engine: Engine, names: Names, feed: Feed) -> None:
    """Each subscriber gets the run events its filter passes, in commit order per run."""
    everything, s_all = _subscribe(engine, names, "alice", ops.StreamFilter())
    diamonds, s_diamond = _subscribe(engine, names, "alice", ops.StreamFilter(("diamond",)))
    mine, s_mine = _subscribe(engine, names, "bob", ops.StreamFilter(runs_submitted_by_me=True))
    first = feed.runs(1, "pipeline", submitted_by="bob")[0]
    second = feed.runs(1, "diamond", submitted_by="alice")[0]

    assert [(d.body["run"], d.body["state"]) for d in _take(engine, everything, s_all)] == [
        (first, "pending"),
        (second, "pending"),
    ]
    assert [d.body["run"] for d in _take(engine, diamonds, s_diamond)] == [second]
    assert [d.body["run"] for d in _take(engine, mine, s_mine)] == [first]


def test_a_reconnection_resends_exactly_the_unacknowledged_updates(
    engine: Engine, names: Names, feed: Feed
) -> None:
    sid, first_stream = _subscribe(engine, names, "alice", ops.StreamFilter())
    for _ in range(5):
        feed.runs(1, "pipeline", submitted_by="alice")[0]
    feed.relay()
    sent = _take(engine, sid, first_stream)
    assert len(sent) == 5
    assert _take(engine, sid, first_stream) == []  # sent, not yet due again
    with transaction(engine) as conn:
        for due in sent[:3]:
            assert due.uuid is not None
            assert ops.acknowledge(conn, first_stream, [due.uuid], owner="alice") == 1

    same, second_stream = _subscribe(engine, names, "alice", ops.StreamFilter(), sid)

    assert same == sid
    assert [d.uuid for d in _take(engine, sid, second_stream)] == [d.uuid for d in sent[3:]]
    with transaction(engine) as conn:
        assert not stream.lock_if_current(conn, sid, first_stream)
        with pytest.raises(StaleStreamError):
            ops.acknowledge(conn, first_stream, [str(sent[4].uuid)], owner="alice")
        with pytest.raises(StaleStreamError):
            ops.acknowledge(conn, second_stream, [str(sent[4].uuid)], owner="mallory")


def test_an_unacknowledged_update_is_resent_on_the_same_stream_after_the_timeout(
    engine: Engine, names: Names, feed: Feed
) -> None:
    sid, stream_id = _subscribe(engine, names, "alice", ops.StreamFilter())
    feed.runs(1, "pipeline", submitted_by="alice")[0]
    feed.relay()
    sent = _take(engine, sid, stream_id, resend_after=0)
    assert len(sent) == 1
    assert [d.uuid for d in _take(engine, sid, stream_id, resend_after=0)] == [sent[0].uuid]


def test_reconcile_answers_once_without_uuid(engine: Engine, names: Names, feed: Feed) -> None:
    sid, stream_id = _subscribe(engine, names, "alice", ops.StreamFilter(("pipeline",)))
    run = feed.runs(1, "pipeline", submitted_by="alice")[0]
    feed.runs(1, "diamond", submitted_by="alice")[0]
    with transaction(engine) as conn:
        assert ops.reconcile(conn, stream_id, [], owner="alice", namespace=names.namespace) == 1
        assert (
            ops.reconcile(conn, stream_id, [run, 10**9], owner="alice", namespace=names.namespace)
            == 2
        )
    answers = _take(engine, sid, stream_id)
    update, *reconciled = [(d.uuid, d.body["run"], d.body["state"]) for d in answers]
    assert update[1:] == (run, "pending")  # the relayed event, to acknowledge
    assert reconciled == [(None, run, "pending"), (None, run, "pending"), (None, 10**9, None)]
    again = _take(engine, sid, stream_id, resend_after=0)
    assert [d.uuid for d in again] == [update[0]]  # the answers were sent once, then forgotten
