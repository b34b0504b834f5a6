"""RabbitMQTransport.publish_many on the real broker: one wait settles a batch, and each
message still gets its own outcome (confirmed, unroutable, nacked), or the batch fails as a
whole when the connection is lost."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any, cast

import pika.exceptions
import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, Step, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.errors import BrokerUnavailableError, PublishError
from sasflow.store.schema import runs
from sasflow.transport.base import Outgoing
from sasflow.transport.confirms import ConfirmTracker
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness, services

pytestmark = pytest.mark.integration


@pytest.fixture
def transport() -> Iterator[RabbitMQTransport]:
    transport = RabbitMQTransport(services.broker_url(), process_name="test-publish-batch")
    transport.connect()
    yield transport
    transport.close()


def _queue(transport: RabbitMQTransport, names: Names, suffix: str) -> str:
    name = f"{names.namespace}.{suffix}"
    transport.declare_queue(name, dead_letter_exchange=None)
    return name


def _bodies(transport: RabbitMQTransport, queue: str) -> list[bytes]:
    bodies = []
    while (delivery := transport.get(queue)) is not None:
        bodies.append(delivery.body)
        transport.ack(delivery)
    return bodies


def test_a_batch_is_confirmed_and_delivered_in_order(
    transport: RabbitMQTransport, names: Names
) -> None:
    """Every message of a 200-message batch is confirmed and arrives, in publish order."""
    queue = _queue(transport, names, "batch")
    bodies = [f"m{i}".encode() for i in range(200)]

    results = transport.publish_many([Outgoing("", queue, b, mandatory=True) for b in bodies])

    assert results == [None] * 200
    assert _bodies(transport, queue) == bodies


def test_an_unroutable_message_fails_alone(transport: RabbitMQTransport, names: Names) -> None:
    """A mandatory message that no queue takes gets its own UnroutableError (a PublishError);
    its neighbours, including an identical body sent to a real queue, are delivered."""
    queue = _queue(transport, names, "routable")
    missing = f"{names.namespace}.nobody-listens"
    batch = [
        Outgoing("", queue, b"first", mandatory=True),
        Outgoing("", missing, b"same", mandatory=True),
        Outgoing("", queue, b"same", mandatory=True),
        Outgoing("", missing, b"not mandatory"),
        Outgoing("", queue, b"last", mandatory=True),
    ]

    results = transport.publish_many(batch)

    assert [type(r).__name__ if r else None for r in results] == [
        None,
        "UnroutableError",
        None,
        None,
        None,
    ]
    assert "unroutable" in str(results[1])
    assert "312" in str(results[1])  # NO_ROUTE
    assert _bodies(transport, queue) == [b"first", b"same", b"last"]


def test_messages_the_broker_nacks_are_to_be_sent_again(
    transport: RabbitMQTransport, names: Names
) -> None:
    """A queue that rejects publishes when full makes the broker nack: those messages were not
    taken (BrokerUnavailableError: send them again on a new connection), the ones it took are
    confirmed."""
    queue = f"{names.namespace}.full"
    with services.broker_channel() as channel:
        channel.queue_declare(
            queue, durable=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
        )

    results = transport.publish_many([Outgoing("", queue, f"m{i}".encode()) for i in range(5)])

    assert results[:2] == [None, None]
    assert all(isinstance(r, BrokerUnavailableError) for r in results[2:])
    assert "nacked" in str(results[2])
    assert _bodies(transport, queue) == [b"m0", b"m1"]


def test_publish_raises_the_refusal_of_its_one_message(
    transport: RabbitMQTransport, names: Names
) -> None:
    """`publish` is a batch of one: a refused message raises PublishError."""
    with pytest.raises(PublishError, match="unroutable"):
        transport.publish(Outgoing("", f"{names.namespace}.nobody", b"x", mandatory=True))
    queue = _queue(transport, names, "after")
    transport.publish(Outgoing("", queue, b"still works", mandatory=True))
    assert _bodies(transport, queue) == [b"still works"]


class _CutAfter(ConfirmTracker):
    """Shuts the connection's socket down once `count` messages were handed to the channel."""

    def __init__(self, sock: socket.socket, count: int) -> None:
        super().__init__()
        self._sock, self._count = sock, count

    def sent(self, exchange: str, routing_key: str, body: bytes, *, mandatory: bool) -> int:
        tag = super().sent(exchange, routing_key, body, mandatory=mandatory)
        if tag == self._count:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        return tag


def test_connection_lost_mid_batch_fails_the_whole_batch(
    transport: RabbitMQTransport, names: Names
) -> None:
    """When the connection drops while a batch waits for its confirms, publish_many raises
    BrokerUnavailableError; after reconnecting, the next batch is confirmed."""
    queue = _queue(transport, names, "lost")
    internals = cast("Any", transport)
    # Fault injection: the test reaches into pika for the socket to cut.
    sock = internals._connection._impl._transport._sock
    internals._tracker = _CutAfter(sock, 3)

    with pytest.raises(BrokerUnavailableError):
        transport.publish_many([Outgoing("", queue, f"m{i}".encode()) for i in range(10)])

    transport.connect()
    assert transport.publish_many([Outgoing("", queue, b"again", mandatory=True)]) == [None]
    assert _bodies(transport, queue)[-1] == b"again"


def test_a_closed_channel_fails_the_batch(transport: RabbitMQTransport, names: Names) -> None:
    """Publishing to an exchange that does not exist makes the broker close the channel: the
    batch raises BrokerUnavailableError instead of waiting for confirms that never come."""
    queue = _queue(transport, names, "closed")
    batch = [
        Outgoing("", queue, b"a"),
        Outgoing(f"{names.namespace}.no-such-exchange", "k", b"b"),
        Outgoing("", queue, b"c"),
    ]
    with pytest.raises(BrokerUnavailableError):
        transport.publish_many(batch)
    with pytest.raises(BrokerUnavailableError):
        transport.publish_many([Outgoing("", queue, b"d")])


def test_an_unroutable_request_waits_again_while_the_rest_of_the_batch_is_dispatched(
    engine: Engine, database_url: str, names: Names
) -> None:
    """The scheduler publishes a claimed batch at once: the request the broker cannot route
    (its agent's queue was deleted) is not the step's fault: the step is released uncharged,
    the queue declared again and the request dispatched there, where it waits for an agent;
    the other requests of the same batch are dispatched and completed."""
    here, gone = Agent("here"), Agent("gone")

    @here.handler("work")
    def work(call: Call) -> dict[str, int]:
        return {"n": call.input["n"]}

    @gone.handler("work")
    def never(call: Call) -> None:
        raise AssertionError("no request can reach this agent")

    registry = Registry(
        [
            Workflow("to-here", [Step("s", "here", "work", input=lambda ctx: ctx.run_input)]),
            Workflow("to-gone", [Step("s", "gone", "work")]),
        ],
        [here, gone],
    )
    scheduler = harness.scheduler(engine, database_url, registry, names)
    with harness.running(scheduler, harness.agent(here, names)):
        harness.wait_for(
            lambda: scheduler.stats.claimed == 0 and _declared(names, "gone"),
            what="the scheduler declared the agent queues",
        )
        with services.broker_channel() as channel:
            channel.queue_delete(names.agent("gone"))
        with engine.begin() as conn:  # one commit: the scheduler claims all five together
            for n in range(4):
                submit_run(
                    conn, registry, "to-here", {"n": n}, key=f"here-{n}", namespace=names.namespace
                )
            submit_run(conn, registry, "to-gone", {}, key="gone", namespace=names.namespace)
        harness.wait_for(
            lambda: list(harness.run_states(engine).values()).count("completed") == 4,
            what="the four reachable runs finish",
        )
        harness.wait_for(lambda: _declared(names, "gone"), what="the gone queue declared again")
        harness.wait_for(lambda: _queued(names, "gone") == 1, what="its request waiting there")
    with engine.connect() as conn:
        states = dict(conn.execute(select(runs.c.business_key, runs.c.state)).all())
    assert states == {
        "here-0": "completed",
        "here-1": "completed",
        "here-2": "completed",
        "here-3": "completed",
        "gone": "running",
    }
    (waiting,) = [s for s in harness.step_rows(engine) if s.agent == "gone"]
    assert (waiting.state, waiting.failure_count, waiting.error) == ("processing", 0, None)
    assert waiting.attempt == 2  # the unrouted attempt was consumed, not charged
    assert scheduler.stats.dispatched == 5


def _declared(names: Names, agent: str) -> bool:
    with services.broker_channel() as channel:
        try:
            channel.queue_declare(names.agent(agent), passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return False
    return True


def _queued(names: Names, agent: str) -> int:
    with services.broker_channel() as channel:
        declared = channel.queue_declare(names.agent(agent), passive=True)
    return int(declared.method.message_count or 0)
