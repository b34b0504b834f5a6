"""The Transport contract: every behaviour the roles rely on, checked on RabbitMQ and on the
in-process bus alike (the `bus` fixture runs each test on both)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

import pytest

from sasflow.errors import BrokerUnavailableError, ConsumerCancelledError, PublishError
from sasflow.transport.base import Delivery, Outgoing, Transport
from sasflow.transport.topology import (
    DEAD_AT_HEADER,
    PROCESS_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    declare_agent_queue,
    declare_breaker_queue,
    declare_common,
)
from tests.contract.bus import Bus, pump, settle, take, take_all

pytestmark = pytest.mark.contract


def setup(bus: Bus, *agents: str) -> Transport:
    transport = bus.transport("setup")
    declare_common(transport, bus.names)
    for agent in agents:
        bus.name(f"agent.{agent}")
        declare_agent_queue(transport, bus.names, agent)
    return transport


def to_queue(queue: str, body: bytes, **fields: object) -> Outgoing:
    return Outgoing("", queue, body, **fields)  # type: ignore[arg-type]


def test_request_reply_carries_correlation_id_and_reply_to(bus: Bus) -> None:
    names = bus.names
    scheduler, agent = setup(bus, "echo"), bus.transport("agent")
    requests: list[Delivery] = []
    replies: list[Delivery] = []

    def on_request(delivery: Delivery) -> None:
        requests.append(delivery)
        assert delivery.reply_to is not None
        agent.publish(
            Outgoing(
                "",
                delivery.reply_to,
                b'{"echo": ' + delivery.body + b"}",
                correlation_id=delivery.correlation_id,
            )
        )
        agent.ack(delivery)

    agent.consume(names.agent("echo"), on_request, prefetch=4)
    scheduler.consume(names.replies, replies.append, prefetch=4)
    scheduler.publish(
        Outgoing(
            "",
            names.agent("echo"),
            b'{"n": 1}',
            expiration_ms=30_000,
            correlation_id="17:2",
            reply_to=names.replies,
            mandatory=True,
        )
    )
    pump([agent, scheduler], lambda: bool(replies))

    request, reply = requests[0], replies[0]
    assert (
        request.body,
        request.queue,
        request.correlation_id,
        request.reply_to,
        request.content_type,
        request.redelivered,
    ) == (b'{"n": 1}', names.agent("echo"), "17:2", names.replies, "application/json", False)
    assert (json.loads(reply.body), reply.queue, reply.correlation_id) == (
        {"echo": {"n": 1}},
        names.replies,
        "17:2",
    )
    assert scheduler.ack(reply) is True


def test_expired_request_is_dead_lettered_with_x_death(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus, "idle")
    transport.publish(
        Outgoing(
            "",
            names.agent("idle"),
            b'{"step_id": 3, "attempt": 1}',
            expiration_ms=50,
            correlation_id="3:1",
            reply_to=names.replies,
            mandatory=True,
        )
    )
    dead = take(transport, names.dead_requests)
    also = take(transport, names.dead_letter_queue)

    for delivery in (dead, also):
        death = delivery.headers["x-death"][0]
        assert {
            k: death[k]
            for k in ("reason", "queue", "count", "exchange", "routing-keys", "original-expiration")
        } == {
            "reason": "expired",
            "queue": names.agent("idle"),
            "count": 1,
            "exchange": "",
            "routing-keys": [names.agent("idle")],
            "original-expiration": "50",
        }
        assert (
            delivery.headers["x-first-death-reason"],
            delivery.headers["x-first-death-queue"],
            delivery.headers["x-first-death-exchange"],
        ) == ("expired", names.agent("idle"), "")
        assert (delivery.body, delivery.correlation_id, delivery.reply_to) == (
            b'{"step_id": 3, "attempt": 1}',
            "3:1",
            names.replies,
        )
    assert transport.get(names.agent("idle")) is None


def test_dead_letter_exchange_routes_requests_also_to_the_supervisors_queue(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus, "payments")
    for queue in (names.agent("payments"), names.submit, names.replies):
        transport.publish(to_queue(queue, queue.encode()))
        transport.dead_letter(
            take(transport, queue), "bad", dead_letter_exchange=names.dead_letter_exchange
        )

    assert [d.body for d in take_all(transport, names.dead_letter_queue)] == [
        names.agent("payments").encode(),
        names.submit.encode(),
        names.replies.encode(),
    ]
    assert [d.body for d in take_all(transport, names.dead_requests)] == [
        names.agent("payments").encode()
    ]


def test_dead_letter_copies_the_message_with_the_reason_headers_and_acks_it(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    transport.publish(
        Outgoing(
            "",
            names.submit,
            b"not json",
            correlation_id="c-1",
            reply_to="somewhere",
            headers={"trace": "t-9", REASON_HEADER: "an older reason"},
        )
    )
    delivery = take(transport, names.submit)
    transport.dead_letter(
        delivery, "body is not UTF-8 JSON", dead_letter_exchange=names.dead_letter_exchange
    )

    copy = take(transport, names.dead_letter_queue)
    assert (copy.body, copy.correlation_id, copy.reply_to) == (b"not json", "c-1", "somewhere")
    headers = dict(copy.headers)
    dead_at = datetime.fromisoformat(str(headers.pop(DEAD_AT_HEADER)))
    assert headers == {
        "trace": "t-9",
        REASON_HEADER: "body is not UTF-8 JSON",
        SOURCE_HEADER: names.submit,
        PROCESS_HEADER: "contract-setup",
    }
    assert abs((datetime.now(UTC) - dead_at).total_seconds()) < 60
    transport.close()  # the original was acked: closing hands nothing back
    transport = bus.transport()
    assert transport.get(names.submit) is None


def test_mandatory_unroutable_message_is_refused(bus: Bus) -> None:
    transport = setup(bus)
    with pytest.raises(PublishError):
        transport.publish(to_queue(bus.name("nobody"), b"{}", mandatory=True))
    with pytest.raises(PublishError):
        transport.publish(Outgoing(bus.names.status, "w.run.completed", b"{}", mandatory=True))
    # Not mandatory: dropped without error, as RabbitMQ does (status events nobody binds).
    transport.publish(to_queue(bus.name("nobody"), b"{}"))
    transport.publish(Outgoing(bus.names.status, "w.run.completed", b"{}"))
    transport.publish(to_queue(bus.names.submit, b"{}", mandatory=True))  # still usable
    assert take(transport, bus.names.submit).body == b"{}"


def test_publishing_to_a_missing_exchange_closes_the_channel(bus: Bus) -> None:
    transport = setup(bus)
    with pytest.raises(BrokerUnavailableError, match="NOT_FOUND"):
        transport.publish(Outgoing(bus.name("no-such-exchange"), "k", b"{}"))
    with pytest.raises(BrokerUnavailableError):
        transport.get(bus.names.submit)
    transport.connect()
    assert transport.get(bus.names.submit) is None


def test_publish_many_settles_each_message(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    results = transport.publish_many(
        [
            to_queue(names.submit, b"1", mandatory=True),
            to_queue(bus.name("nobody"), b"2", mandatory=True),
            to_queue(names.submit, b"3", mandatory=True),
            to_queue(bus.name("nobody"), b"4"),
        ]
    )
    # A returned message is an UnroutableError (a PublishError): callers may tell it apart.
    assert [type(r).__name__ if r else None for r in results] == [
        None,
        "UnroutableError",
        None,
        None,
    ]
    assert [d.body for d in take_all(transport, names.submit)] == [b"1", b"3"]


def test_prefetch_limits_unacked_deliveries_per_consumer(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    transport.publish_many([to_queue(names.submit, str(i).encode()) for i in range(5)])
    got: list[Delivery] = []
    transport.consume(names.submit, got.append, prefetch=2)
    pump([transport], lambda: len(got) >= 2)
    settle([transport])
    assert [d.body for d in got] == [b"0", b"1"]

    transport.ack(got[0])
    pump([transport], lambda: len(got) >= 3)
    settle([transport])
    assert [d.body for d in got] == [b"0", b"1", b"2"]


def test_ack_multiple_acks_every_earlier_delivery(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    transport.publish_many([to_queue(names.replies, str(i).encode()) for i in range(4)])
    got: list[Delivery] = []
    transport.consume(names.replies, got.append, prefetch=10)
    pump([transport], lambda: len(got) == 4)
    assert transport.ack(got[2], multiple=True) is True
    transport.close()

    again = bus.transport()
    left = take(again, names.replies)
    assert (left.body, left.redelivered) == (b"3", True)
    again.ack(left)
    assert again.get(names.replies) is None


def test_unacked_deliveries_are_redelivered_after_close(bus: Bus) -> None:
    names = bus.names
    first = setup(bus, "echo")
    first.publish_many([to_queue(names.agent("echo"), b"a"), to_queue(names.agent("echo"), b"b")])
    got: list[Delivery] = []
    first.consume(names.agent("echo"), got.append, prefetch=5)
    pump([first], lambda: len(got) == 2)
    assert [(d.body, d.redelivered) for d in got] == [(b"a", False), (b"b", False)]
    first.close()

    second = bus.transport("second")
    again: list[Delivery] = []
    second.consume(names.agent("echo"), again.append, prefetch=5)
    pump([second], lambda: len(again) == 2)
    assert [(d.body, d.redelivered) for d in again] == [(b"a", True), (b"b", True)]


def test_requeue_hands_a_delivery_back_to_the_head_of_its_queue(bus: Bus) -> None:
    """What the submitter does with a submission held too long: it comes back, redelivered,
    before what was behind it; a requeue of an older generation is refused."""
    names = bus.names
    transport = setup(bus)
    transport.publish_many([to_queue(names.submit, b"a"), to_queue(names.submit, b"b")])
    got: list[Delivery] = []
    transport.consume(names.submit, got.append, prefetch=1)
    pump([transport], lambda: len(got) == 1)
    assert transport.requeue(got[0]) is True
    pump([transport], lambda: len(got) == 2)
    assert [(d.body, d.redelivered) for d in got] == [(b"a", False), (b"a", True)]
    transport.ack(got[1])
    pump([transport], lambda: len(got) == 3)
    assert got[2].body == b"b"
    transport.connect()
    assert transport.requeue(got[2]) is False


def test_acks_of_an_older_generation_are_refused(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    transport.publish(to_queue(names.submit, b"x"))
    old = take(transport, names.submit)
    generation = transport.generation
    transport.connect()  # reconnect: the old delivery's channel is gone

    assert transport.generation == generation + 1
    assert transport.ack(old) is False
    new = take(transport, names.submit)
    assert (new.body, new.redelivered, new.generation) == (b"x", True, generation + 1)
    assert transport.ack(new) is True
    assert transport.get(names.submit) is None


def test_get_takes_one_message_without_a_consumer(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    assert transport.get(names.submit) is None
    transport.publish(
        Outgoing(
            "", names.submit, b'{"k": 1}', headers={"h": "v"}, correlation_id="c", reply_to="r"
        )
    )
    delivery = take(transport, names.submit)
    assert (
        delivery.body,
        delivery.queue,
        dict(delivery.headers),
        delivery.correlation_id,
        delivery.reply_to,
        delivery.redelivered,
        delivery.generation,
    ) == (b'{"k": 1}', names.submit, {"h": "v"}, "c", "r", False, transport.generation)
    assert transport.ack(delivery) is True
    assert transport.get(names.submit) is None


def test_status_topic_bindings_route_by_workflow_entity_and_state(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    bindings = {
        "runs-of-order": "order.run.*",
        "errors": "*.step.error",
        "all": "#",
        "completed": "*.run.completed",
    }
    for queue, key in bindings.items():
        transport.declare_queue(bus.name(queue), dead_letter_exchange=None)
        transport.bind_queue(bus.name(queue), names.status, key)
    for key in (
        "order.run.completed",
        "order.step.error",
        "media.run.completed",
        "media.step.processed",
    ):
        transport.publish(
            Outgoing(names.status, key, key.encode(), headers={"run_id": 7, "key": "A-1"})
        )

    taken = {queue: take_all(transport, bus.name(queue)) for queue in bindings}
    received = {queue: [d.body.decode() for d in deliveries] for queue, deliveries in taken.items()}
    assert {(d.headers["run_id"], d.headers["key"]) for d in taken["all"]} == {(7, "A-1")}
    assert received == {
        "runs-of-order": ["order.run.completed"],
        "errors": ["order.step.error"],
        "all": [
            "order.run.completed",
            "order.step.error",
            "media.run.completed",
            "media.step.processed",
        ],
        "completed": ["order.run.completed", "media.run.completed"],
    }


def test_max_length_drops_the_oldest_into_the_dead_letter_exchange(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    bounded = bus.name("bounded")
    transport.declare_queue(bounded, dead_letter_exchange=names.dead_letter_exchange, max_length=2)
    transport.publish_many([to_queue(bounded, str(i).encode()) for i in range(3)])

    assert [d.body for d in take_all(transport, bounded)] == [b"1", b"2"]
    dropped = take(transport, names.dead_letter_queue)
    death = dropped.headers["x-death"][0]
    assert (dropped.body, death["reason"], death["queue"], death["count"]) == (
        b"0",
        "maxlen",
        bounded,
        1,
    )


def test_declarations_are_idempotent_and_conflicts_are_refused(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    declare_common(transport, names)  # again, same arguments: fine
    with pytest.raises(BrokerUnavailableError, match="PRECONDITION_FAILED"):
        transport.declare_queue(names.submit, dead_letter_exchange=None)
    transport.connect()  # the refusal closed the channel, as RabbitMQ does
    with pytest.raises(BrokerUnavailableError, match="PRECONDITION_FAILED"):
        transport.declare_exchange(names.status, "direct")


def test_a_breaker_fanout_reaches_every_instance_queue_and_expiry_must_match(bus: Bus) -> None:
    """The fleet's breaker topology: a fanout exchange per agent, a queue per instance with
    x-expires; redeclaring that queue with another expiry is refused, as RabbitMQ does."""
    names = bus.names
    transport = setup(bus)
    agent = "shared"
    first = declare_breaker_queue(transport, names, agent, "one")
    second = declare_breaker_queue(transport, names, agent, "two")
    bus.named.extend([first, second, names.breakers(agent)])
    transport.publish(Outgoing(exchange=names.breakers(agent), routing_key="", body=b"open"))
    assert [take(transport, q).body for q in (first, second)] == [b"open", b"open"]
    with pytest.raises(BrokerUnavailableError, match="PRECONDITION_FAILED"):
        transport.declare_queue(first, dead_letter_exchange=None, max_length=1000, expires_ms=1)


def test_call_threadsafe_runs_the_callback_on_the_owner_thread(bus: Bus) -> None:
    transport = setup(bus)
    ran_on: list[int] = []
    helper = threading.Thread(
        target=lambda: transport.call_threadsafe(lambda: ran_on.append(threading.get_ident()))
    )
    helper.start()
    helper.join()
    pump([transport], lambda: bool(ran_on))
    assert ran_on == [threading.get_ident()]


def test_cancelled_consumer_gets_nothing_new_but_can_ack_what_it_holds(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    got: list[Delivery] = []
    transport.consume(names.replies, got.append, prefetch=10)
    transport.publish(to_queue(names.replies, b"1"))
    pump([transport], lambda: len(got) == 1)
    transport.cancel_consumers()
    transport.publish(to_queue(names.replies, b"2"))
    settle([transport])

    assert [d.body for d in got] == [b"1"]
    assert transport.ack(got[0]) is True
    assert [d.body for d in take_all(transport, names.replies)] == [b"2"]


def test_a_queue_deleted_under_its_consumer_is_raised_as_a_lost_connection(bus: Bus) -> None:
    """The broker cancels the consumer of a deleted queue: `process` raises
    ConsumerCancelledError (a BrokerUnavailableError) naming the queue, once; connecting,
    declaring and consuming again delivers what is published next."""
    names = bus.names
    agent = setup(bus, "echo")
    queue = names.agent("echo")
    got: list[Delivery] = []
    agent.consume(queue, got.append, prefetch=4)
    agent.publish(to_queue(queue, b"before"))
    pump([agent], lambda: len(got) == 1)

    bus.delete_queue(queue)
    with pytest.raises(ConsumerCancelledError) as raised:
        settle([agent], seconds=5.0)
    assert isinstance(raised.value, BrokerUnavailableError)
    assert raised.value.queues == (queue,)
    settle([agent])  # raised once per cancel

    agent.connect()
    declare_agent_queue(agent, names, "echo")
    agent.consume(queue, got.append, prefetch=4)
    agent.publish(to_queue(queue, b"after", mandatory=True))
    pump([agent], lambda: len(got) == 2)
    assert [d.body for d in got] == [b"before", b"after"]


def test_a_queue_deleted_after_its_consumer_was_cancelled_raises_nothing(bus: Bus) -> None:
    names = bus.names
    transport = setup(bus)
    other = bus.transport("other")
    own = bus.name("own")
    other.declare_queue(own, dead_letter_exchange=None)
    transport.consume(own, lambda _delivery: None, prefetch=1)
    other.consume(names.replies, lambda _delivery: None, prefetch=1)
    transport.cancel_consumers()

    bus.delete_queue(own)
    settle([transport, other])  # neither the cancelled consumer nor another queue's raises

    assert transport.consumer_count(names.replies) == 1


def test_competing_consumers_share_a_queue(bus: Bus) -> None:
    names = bus.names
    setup(bus, "echo")
    first, second = bus.transport("first"), bus.transport("second")
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    first.consume(names.agent("echo"), lambda d: got["first"].append(d.body), prefetch=1)
    second.consume(names.agent("echo"), lambda d: got["second"].append(d.body), prefetch=1)
    bus.opened[0].publish_many([to_queue(names.agent("echo"), str(i).encode()) for i in range(4)])
    pump([first, second], lambda: len(got["first"]) + len(got["second"]) == 2)
    settle([first, second])
    # Each holds one unacked message (prefetch 1): the other two wait in the queue.
    assert (len(got["first"]), len(got["second"])) == (1, 1)
    assert sorted(got["first"] + got["second"]) == [b"0", b"1"]


def test_consumer_count_follows_consumers_of_a_pool_queue(bus: Bus) -> None:
    """A pool's queue reports no consumer until an agent consumes it, and none again after
    the agent cancels (what the scheduler asks before dispatching a pooled step)."""
    names = bus.names
    scheduler, agent = setup(bus), bus.transport("agent")
    bus.name("agent.echo.pool.gpu")
    declare_agent_queue(scheduler, names, "echo", "gpu")
    queue = names.pool("echo", "gpu")
    assert scheduler.consumer_count(queue) == 0
    agent.consume(queue, lambda _delivery: None, prefetch=1)
    assert scheduler.consumer_count(queue) == 1
    agent.cancel_consumers()
    assert scheduler.consumer_count(queue) == 0


def test_message_count_counts_ready_messages_and_a_requeued_one_comes_back_first(
    bus: Bus,
) -> None:
    """What the supervisor's dead-letter retention relies on: the count of what waits (not
    what is held unacked), and a message handed back is the head again."""
    names = bus.names
    transport = setup(bus, "echo")
    queue = names.agent("echo")
    assert transport.message_count(queue) == 0
    transport.publish_many([to_queue(queue, str(i).encode()) for i in range(3)])
    assert transport.message_count(queue) == 3
    held = take(transport, queue)
    assert (held.body, transport.message_count(queue)) == (b"0", 2)
    assert transport.requeue(held)
    again = take(transport, queue)
    assert again.body == b"0"
    transport.ack(again)
    assert transport.message_count(queue) == 2


def test_cancelling_one_queues_consumer_leaves_the_others_and_its_unacked_can_be_requeued(
    bus: Bus,
) -> None:
    """What a wedged agent does (sasflow.agents.wedge): it stops consuming its requests while
    its breaker queue's consumer goes on, and hands back a request it took, which another
    consumer then gets."""
    names = bus.names
    agent = setup(bus, "echo")
    requests: list[Delivery] = []
    replies: list[Delivery] = []
    agent.consume(names.agent("echo"), requests.append, prefetch=1)
    agent.consume(names.replies, replies.append, prefetch=10)
    agent.publish(to_queue(names.agent("echo"), b"taken"))
    pump([agent], lambda: len(requests) == 1)

    agent.cancel_consumers(names.agent("echo"))
    agent.publish_many([to_queue(names.agent("echo"), b"later"), to_queue(names.replies, b"r")])
    pump([agent], lambda: len(replies) == 1)
    settle([agent])
    assert [d.body for d in requests] == [b"taken"], "no request after the cancel"
    assert agent.requeue(requests[0]) is True

    other = bus.transport("other")
    again: list[Delivery] = []
    other.consume(names.agent("echo"), again.append, prefetch=5)
    pump([other], lambda: len(again) == 2)
    assert sorted(d.body for d in again) == [b"later", b"taken"]
