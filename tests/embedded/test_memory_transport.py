"""What only the in-process bus has: threads sharing one MemoryBroker, the outage hook, waiting
without polling, and copies instead of shared objects (the rest is in tests/contract)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sasflow.errors import BrokerUnavailableError
from sasflow.transport.base import Delivery, Outgoing
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.memory.model import topic_matches
from sasflow.transport.topology import Names, declare_agent_queue, declare_common

NAMES = Names("mem")


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture
def connect(broker: MemoryBroker) -> Iterator[Callable[[str], MemoryTransport]]:
    opened: list[MemoryTransport] = []

    def make(role: str) -> MemoryTransport:
        transport = MemoryTransport(broker, process_name=role)
        transport.connect()
        declare_common(transport, NAMES)
        declare_agent_queue(transport, NAMES, "echo")
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        transport.close()


def in_thread(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except Exception as exc:  # noqa: BLE001 - reported to the test through `errors`
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_idle_process_sleeps_instead_of_polling(connect: Callable[[str], MemoryTransport]) -> None:
    transport = connect("idle")
    got: list[Delivery] = []
    transport.consume(NAMES.submit, got.append, prefetch=1)
    cpu, wall = time.thread_time(), time.monotonic()
    transport.process(0.5)
    cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
    assert wall >= 0.49
    assert cpu < 0.05, f"process() used {cpu:.3f}s of CPU waiting 0.5s: it polls"
    assert got == []


def test_process_wakes_up_when_another_thread_publishes(
    connect: Callable[[str], MemoryTransport],
) -> None:
    consumer, producer = connect("consumer"), connect("producer")
    got: list[Delivery] = []
    consumer.consume(NAMES.submit, got.append, prefetch=1)
    returned_after: list[float] = []

    def wait_once() -> None:
        started = time.monotonic()
        consumer.process(30)
        returned_after.append(time.monotonic() - started)

    thread, errors = in_thread(wait_once)
    time.sleep(0.2)
    producer.publish(Outgoing("", NAMES.submit, b"wake"))
    thread.join(10)
    assert errors == []
    assert [d.body for d in got] == [b"wake"]
    assert returned_after[0] < 10, "process() slept through the delivery"


def test_call_threadsafe_wakes_the_owner_and_runs_there(
    connect: Callable[[str], MemoryTransport],
) -> None:
    owner = connect("owner")
    ran_on: list[int] = []
    owner_ident: list[int] = []

    def serve() -> None:
        owner_ident.append(threading.get_ident())
        owner.process(30)

    thread, errors = in_thread(serve)
    time.sleep(0.1)
    owner.call_threadsafe(lambda: ran_on.append(threading.get_ident()))
    thread.join(10)
    assert errors == []
    assert ran_on == owner_ident


def test_expiry_happens_while_consumers_wait_without_anyone_calling_get(
    connect: Callable[[str], MemoryTransport],
) -> None:
    operator, scheduler = connect("operator"), connect("scheduler")
    dead: list[Delivery] = []
    operator.consume(NAMES.dead_letter_queue, dead.append, prefetch=10)
    scheduler.publish(
        Outgoing(
            "", NAMES.agent("echo"), b"{}", expiration_ms=100, correlation_id="1:1", mandatory=True
        )
    )
    started = time.monotonic()
    while not dead and time.monotonic() - started < 10:
        operator.process(5)
    assert [(d.body, d.headers["x-death"][0]["reason"]) for d in dead] == [(b"{}", "expired")]


def test_expiry_is_checked_at_the_head_of_the_queue_like_rabbitmq(
    connect: Callable[[str], MemoryTransport],
    broker: MemoryBroker,
) -> None:
    transport = connect("t")
    queue = NAMES.agent("echo")
    transport.publish(Outgoing("", queue, b"long", expiration_ms=60_000))
    transport.publish(Outgoing("", queue, b"short", expiration_ms=50))
    time.sleep(0.1)
    assert broker.depth(queue) == 2  # the short one waits behind the long one
    head = transport.get(queue)
    assert head is not None
    assert head.body == b"long"
    assert transport.get(queue) is None  # now at the head, the short one expired
    dead = transport.get(NAMES.dead_letter_queue)
    assert dead is not None
    assert dead.body == b"short"


def test_outage_fails_every_operation_until_the_transport_reconnects(
    connect: Callable[[str], MemoryTransport],
    broker: MemoryBroker,
) -> None:
    agent, scheduler = connect("agent"), connect("scheduler")
    got: list[Delivery] = []
    agent.consume(NAMES.agent("echo"), got.append, prefetch=5)
    scheduler.publish(Outgoing("", NAMES.agent("echo"), b"held"))
    agent.process(1)
    assert [d.body for d in got] == [b"held"]

    blocked, errors = in_thread(lambda: agent.process(30))
    time.sleep(0.1)
    broker.disconnect_all(stay_down=True)
    blocked.join(5)
    assert [type(e) for e in errors] == [BrokerUnavailableError]
    for operation in (
        lambda: scheduler.publish(Outgoing("", NAMES.submit, b"x")),
        lambda: scheduler.get(NAMES.submit),
        lambda: scheduler.process(0),
        lambda: scheduler.call_threadsafe(lambda: None),
        lambda: agent.ack(got[0]),
        agent.connect,
    ):
        with pytest.raises(BrokerUnavailableError):
            operation()

    broker.restore()
    agent.connect()
    assert agent.ack(got[0]) is False  # an older generation: the broker requeued it
    again = agent.get(NAMES.agent("echo"))
    assert again is not None
    assert (again.body, again.redelivered) == (b"held", True)
    assert agent.ack(again) is True


def test_messages_are_copied_not_shared(connect: Callable[[str], MemoryTransport]) -> None:
    transport = connect("t")
    transport.declare_exchange("mem.fan", "fanout")
    for queue in ("mem.one", "mem.two"):
        transport.declare_queue(queue, dead_letter_exchange=None)
        transport.bind_queue(queue, "mem.fan", "")
    headers = {"nested": {"n": 1}}
    body = bytearray(b"body")
    transport.publish(Outgoing("mem.fan", "", bytes(body), headers=headers))
    headers["nested"]["n"] = 2
    body[:] = b"XXXX"

    one = transport.get("mem.one")
    assert one is not None
    one.headers["nested"]["n"] = 3  # the consumer scribbles on its copy
    transport.close()  # ... and does not ack it: it is redelivered from the broker's copy
    transport = connect("t2")
    again, two = transport.get("mem.one"), transport.get("mem.two")
    assert again is not None
    assert two is not None
    assert (again.body, again.headers, two.headers) == (
        b"body",
        {"nested": {"n": 1}},
        {"nested": {"n": 1}},
    )


def test_competing_consumers_in_threads_share_the_queue_round_robin(
    connect: Callable[[str], MemoryTransport],
) -> None:
    total = 400
    received: dict[str, list[bytes]] = {"a": [], "b": []}
    done = threading.Event()
    consuming = threading.Barrier(3)

    def worker(name: str) -> Callable[[], None]:
        transport = connect(name)  # created here, owned by the test thread's fixture list

        def on_message(delivery: Delivery) -> None:
            received[name].append(delivery.body)
            transport.ack(delivery)

        def serve() -> None:
            transport.consume(NAMES.replies, on_message, prefetch=1)
            consuming.wait(10)
            while not done.is_set():
                transport.process(0.05)
            transport.cancel_consumers()

        return serve

    threads = [in_thread(worker(name)) for name in received]
    producer = connect("producer")
    consuming.wait(10)
    for i in range(total):
        producer.publish(Outgoing("", NAMES.replies, str(i).encode()))
    deadline = time.monotonic() + 30
    while sum(map(len, received.values())) < total and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()
    for thread, errors in threads:
        thread.join(10)
        assert errors == []
    everything = sorted(int(b) for bodies in received.values() for b in bodies)
    assert everything == list(range(total))  # each exactly once
    assert all(received.values()), "one consumer got nothing: no round-robin"


def test_concurrent_producers_keep_each_ones_order(
    connect: Callable[[str], MemoryTransport],
) -> None:
    consumer = connect("consumer")
    per_producer = 300
    got: list[bytes] = []

    def on_message(delivery: Delivery) -> None:
        got.append(delivery.body)
        consumer.ack(delivery)

    consumer.consume(NAMES.submit, on_message, prefetch=50)

    def produce(name: str) -> Callable[[], None]:
        transport = connect(name)

        def publish() -> None:
            results = transport.publish_many(
                [Outgoing("", NAMES.submit, f"{name}:{i}".encode()) for i in range(per_producer)]
            )
            assert results == [None] * per_producer

        return publish

    producers = [in_thread(produce(f"p{n}")) for n in range(3)]
    deadline = time.monotonic() + 30
    while len(got) < 3 * per_producer and time.monotonic() < deadline:
        consumer.process(0.05)
    for thread, errors in producers:
        thread.join(10)
        assert errors == []
    for n in range(3):
        mine = [int(b.split(b":")[1]) for b in got if b.startswith(f"p{n}:".encode())]
        assert mine == list(range(per_producer))


def test_handler_error_leaves_the_rest_for_the_next_process(
    connect: Callable[[str], MemoryTransport],
) -> None:
    transport = connect("t")
    seen: list[bytes] = []

    def handler(delivery: Delivery) -> None:
        seen.append(delivery.body)
        if delivery.body == b"boom":
            raise RuntimeError("handler bug")

    transport.publish_many([Outgoing("", NAMES.submit, b) for b in (b"boom", b"next")])
    transport.consume(NAMES.submit, handler, prefetch=10)
    with pytest.raises(RuntimeError, match="handler bug"):
        transport.process(1)
    transport.process(1)
    assert seen == [b"boom", b"next"]


def test_acking_twice_closes_the_channel_like_rabbitmq(
    connect: Callable[[str], MemoryTransport],
) -> None:
    transport = connect("t")
    transport.publish(Outgoing("", NAMES.submit, b"x"))
    delivery = transport.get(NAMES.submit)
    assert delivery is not None
    assert transport.ack(delivery) is True
    with pytest.raises(BrokerUnavailableError, match="unknown delivery tag"):
        transport.ack(delivery)
    with pytest.raises(BrokerUnavailableError):
        transport.get(NAMES.submit)


def test_dead_letter_cycles_are_cut(connect: Callable[[str], MemoryTransport]) -> None:
    transport = connect("t")
    transport.declare_exchange("mem.loop", "fanout")
    transport.declare_queue("mem.tiny", dead_letter_exchange="mem.loop", max_length=1)
    transport.bind_queue("mem.tiny", "mem.loop", "")
    transport.publish_many([Outgoing("", "mem.tiny", b) for b in (b"1", b"2", b"3")])
    last = transport.get("mem.tiny")
    assert last is not None
    assert last.body == b"3"
    assert transport.get("mem.tiny") is None


def test_brokers_are_independent() -> None:
    first, second = MemoryBroker(), MemoryBroker()
    a, b = MemoryTransport(first, process_name="a"), MemoryTransport(second, process_name="b")
    a.connect()
    b.connect()
    a.declare_queue("q", dead_letter_exchange=None)
    b.declare_queue("q", dead_letter_exchange="other")  # no conflict: another broker
    a.publish(Outgoing("", "q", b"x"))
    assert (first.depth("q"), second.depth("q")) == (1, 0)


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("order.run.*", "order.run.completed", True),
        ("order.run.*", "order.run", False),
        ("*.step.error", "media.step.error", True),
        ("#", "a.b.c", True),
        ("#", "", True),
        ("a.#", "a", True),
        ("a.#.c", "a.b.x.c", True),
        ("a.#.c", "a.b.x.d", False),
        ("#.c", "c", True),
        ("a.*.c", "a.c", False),
        ("order.run.completed", "order.run.completed", True),
        ("order.run.completed", "order.run.error", False),
    ],
)
def test_topic_matching(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches
