"""The scheduler's relay (sasflow.relay.Relay) on PostgreSQL and RabbitMQ: a batch goes out
without waiting for its confirms, its rows stay locked (no other relay publishes them) until
it is marked, and a batch whose channel is lost is rolled back and published again."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pika
import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, submit_run
from sasflow.errors import BrokerUnavailableError, StoreUnavailableError
from sasflow.relay import Relay, relay_events
from sasflow.states import RunState
from sasflow.store.db import EngineOptions, make_engine, transaction
from sasflow.store.runs import events as store_events
from sasflow.store.schema import events
from sasflow.transport.base import Outgoing
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names, declare_common
from tests import harness, services
from tests.apps.basic import echo, pipeline

pytestmark = pytest.mark.integration

REGISTRY = Registry(workflows=[pipeline], agents=[echo])


@pytest.fixture
def transport(names: Names) -> Iterator[RabbitMQTransport]:
    transport = RabbitMQTransport(services.broker_url(), process_name="test-relay")
    transport.connect()
    declare_common(transport, names)
    yield transport
    transport.close()


def _submit(engine: Engine, names: Names, count: int) -> None:
    with transaction(engine) as conn:
        for i in range(count):
            submit_run(conn, REGISTRY, "pipeline", {"text": f"t{i}"}, namespace=names.namespace)


def _unpublished(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(events.c.id).where(events.c.published.is_(False))).all())


def _event_ids(queue: str) -> list[int]:
    connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
    try:
        channel = connection.channel()
        ids: list[int] = []
        while True:
            _method, _props, body = channel.basic_get(queue, auto_ack=True)
            if body is None:
                return ids
            ids.append(json.loads(body)["event_id"])
    finally:
        connection.close()


def test_a_batch_in_flight_stays_locked_until_marked(
    engine: Engine, names: Names, transport: RabbitMQTransport
) -> None:
    """Events published without waiting are neither taken by another relay meanwhile nor
    marked before their confirms; once polled after the confirms they are marked, and each
    was published once."""
    queue = harness.bind_status_queue(names)
    _submit(engine, names, 3)
    relay = Relay(engine, transport, names)

    assert relay.start() == 3
    assert relay.in_flight
    assert relay_events(engine, transport, names) == 0  # locked by the batch in flight
    assert _unpublished(engine) == 3

    relay.flush()

    assert not relay.in_flight
    assert _unpublished(engine) == 0
    assert sorted(_event_ids(queue)) == [1, 2, 3]


def test_a_batch_on_a_lost_channel_is_published_again(
    engine: Engine, names: Names, transport: RabbitMQTransport
) -> None:
    """A batch abandoned with its channel (the scheduler reconnects) is rolled back: the next
    relay publishes its events again (at least once)."""
    queue = harness.bind_status_queue(names)
    _submit(engine, names, 2)
    relay = Relay(engine, transport, names)
    assert relay.start() == 2

    relay.abandon()
    transport.connect()

    assert _unpublished(engine) == 2
    assert relay.start() == 2
    relay.flush()
    assert _unpublished(engine) == 0
    assert sorted(_event_ids(queue)) == [1, 1, 2, 2]


def test_with_a_pool_of_one_connection_a_batch_waits_for_its_confirms(
    database_url: str, engine: Engine, names: Names, transport: RabbitMQTransport
) -> None:
    """A batch in flight holds a connection the loop would then lack: with a pool of one,
    the relay waits for the confirms as relay_events does, and marks the batch at once."""
    _submit(engine, names, 2)
    single = make_engine(database_url, EngineOptions(pool_size=1, max_overflow=0))
    try:
        relay = Relay(single, transport, names)
        assert relay.start() == 2
        assert not relay.in_flight
        assert _unpublished(engine) == 0
    finally:
        single.dispose()


def test_a_pool_shared_and_busy_makes_the_batch_wait_for_its_confirms(
    engine: Engine, database_url: str, names: Names, transport: RabbitMQTransport
) -> None:
    """The roles of `sasflow run` share one pool: when others hold all but one of its
    connections, the relay does not keep a batch (and its connection) in flight."""
    _submit(engine, names, 2)
    shared = make_engine(database_url, EngineOptions(pool_size=4, max_overflow=0))
    held = [shared.connect() for _ in range(3)]
    try:
        relay = Relay(shared, transport, names)
        assert relay.start() == 2
        assert not relay.in_flight
        assert _unpublished(engine) == 0
    finally:
        for conn in held:
            conn.close()
        shared.dispose()


def test_a_runs_later_event_waits_while_another_relay_holds_an_earlier_one(
    engine: Engine, names: Names, transport: RabbitMQTransport
) -> None:
    """A relay holding a run's first unpublished event (waiting for its confirms) keeps every
    other relay off that run's later events, so the status messages (and the stream's updates)
    keep the run's order; another run's events go on."""
    queue = harness.bind_status_queue(names)
    _submit(engine, names, 2)
    with engine.connect() as conn:
        (held, first_run), (other, _) = conn.execute(
            select(events.c.id, events.c.run_id).order_by(events.c.id)
        ).all()
    with transaction(engine) as conn:
        store_events.record(
            conn,
            [
                store_events.Event(
                    run_id=first_run, entity="run", to_state=RunState.RUNNING, actor="t"
                )
            ],
        )
    holder = engine.connect()
    try:
        holder.begin()
        holder.execute(select(events.c.id).where(events.c.id == held).with_for_update())
        assert relay_events(engine, transport, names) == 1  # the other run's event only
        assert _event_ids(queue) == [other]
    finally:
        holder.close()  # the holder gives up (a rollback): its event is unpublished again
    assert relay_events(engine, transport, names) == 2
    later = _later(engine, first_run, held)
    assert _event_ids(queue) == [held, later]


def _later(engine: Engine, run_id: int, held: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(events.c.id).where(events.c.run_id == run_id, events.c.id > held)
            ).scalar_one()
        )


def test_a_database_error_with_confirms_pending_leaves_no_confirm_kept(
    engine: Engine, names: Names, transport: RabbitMQTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first of two batches in flight cannot be marked (the database fails): both are
    rolled back, the transport keeps no tag of theirs (their confirms, on a channel that lives
    on, are attributed to no one), and the next relay publishes their events again."""
    queue = harness.bind_status_queue(names)
    _submit(engine, names, 3)
    relay = Relay(engine, transport, names, limit=2)
    assert relay.start() == 2
    assert relay.start() == 1
    assert relay.in_flight

    def fails(*_args: object, **_kwargs: object) -> None:
        raise StoreUnavailableError("database gone (test)")

    with monkeypatch.context() as patched:
        patched.setattr(store_events, "mark_published", fails)
        with pytest.raises(StoreUnavailableError):
            relay.flush()
    assert not relay.in_flight
    # Confirms come in order: once this one is back, those of both batches have arrived.
    transport.publish(Outgoing("", queue, b"{}"))
    assert transport.confirms_tracked == 0
    assert _unpublished(engine) == 3

    assert relay_events(engine, transport, names) == 3
    assert _unpublished(engine) == 0


@pytest.mark.parametrize("waits", [True, False], ids=["relay_events", "in flight"])
def test_status_events_the_broker_nacks_stay_unpublished_until_it_takes_them(
    engine: Engine, names: Names, transport: RabbitMQTransport, waits: bool
) -> None:
    """A queue bound to the status exchange that is full under `reject-publish` makes the
    broker nack the events: nothing is marked (at least once), and once the queue takes
    messages again the next relay publishes them."""
    queue = f"{names.namespace}.full-status"
    with services.broker_channel() as channel:
        channel.queue_declare(
            queue, durable=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
        )
        channel.queue_bind(queue, names.status, routing_key="#")
        for _ in range(2):
            channel.basic_publish("", queue, b'{"event_id": 0}')
    _submit(engine, names, 2)
    relay = Relay(engine, transport, names)

    if waits:
        with pytest.raises(BrokerUnavailableError, match="nacked"):
            relay_events(engine, transport, names)
    else:
        assert relay.start() == 2
        with pytest.raises(BrokerUnavailableError, match="nacked"):
            relay.flush()
    assert _unpublished(engine) == 2

    transport.connect()  # a nack sends the relay to a new connection
    assert _event_ids(queue) == [0, 0]  # the fillers go: the queue takes messages again
    assert relay_events(engine, transport, names) == 2
    assert _unpublished(engine) == 0
    assert len(_event_ids(queue)) == 2
