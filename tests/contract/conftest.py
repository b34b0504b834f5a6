"""The `bus` fixture: every contract test runs once on RabbitMQ and once on the in-process bus."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from sasflow.transport.base import Transport
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import services
from tests.contract.bus import Bus


def _delete(bus: Bus) -> None:
    """Delete the test's queues and exchanges on RabbitMQ (known by name: no rabbitmqctl)."""
    names = bus.names
    queues = {*names.all_queues([]), *bus.named}
    exchanges = {names.status, names.alerts, names.dead_letter_exchange, names.fleet, *bus.named}
    with services.broker_channel() as channel:
        for queue in sorted(queues):
            channel.queue_delete(queue)
        for exchange in sorted(exchanges):
            channel.exchange_delete(exchange)


@pytest.fixture(params=["rabbitmq", "memory"])
def bus(request: pytest.FixtureRequest) -> Iterator[Bus]:
    """RabbitMQ on the real broker in the test's own namespace, or a fresh MemoryBroker."""
    names = Names(services.unique("sfcontract"))
    if request.param == "rabbitmq":

        def make(role: str) -> Transport:
            return RabbitMQTransport(services.broker_url(), process_name=f"contract-{role}")

        def delete_queue(queue: str) -> None:
            with services.broker_channel() as channel:
                channel.queue_delete(queue)
    else:
        broker = MemoryBroker()

        def make(role: str) -> Transport:
            return MemoryTransport(broker, process_name=f"contract-{role}")

        def delete_queue(queue: str) -> None:
            broker.delete_queue(queue)

    bus = Bus(request.param, names, make, delete_queue)
    try:
        yield bus
    finally:
        bus.close()
        if request.param == "rabbitmq":
            with contextlib.suppress(Exception):  # best effort: never mask the test's result
                _delete(bus)
