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
from sasflow.relay import Relay, relay_events
from sasflow.store.db import EngineOptions, make_engine, transaction
from sasflow.store.schema import events
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
