"""A run's event held back by a scheduler's relay (another relay held the run's earlier event,
awaiting its confirms) goes out milliseconds after that earlier one is marked, not at the
relay's next periodic pass (issue 26: a one-second tail on the `run.completed` events).

The relay interval is a minute here, so an event left to the periodic pass cannot make it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pika
import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, submit_run
from sasflow.relay import Relay, relay_pass
from sasflow.scheduler.outbox import RelayDuty
from sasflow.states import RunState
from sasflow.store.db import transaction
from sasflow.store.runs import events as store_events
from sasflow.store.schema import events
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names, declare_common
from tests import harness, services
from tests.apps.basic import echo, pipeline

pytestmark = pytest.mark.integration

REGISTRY = Registry(workflows=[pipeline], agents=[echo])
INTERVAL = 60.0
"""The relay interval of the relay under test: far beyond any bound asserted."""
BOUND = 1.0
"""Seconds within which the held-back event must be out once its predecessor is marked (it
takes milliseconds; the bound leaves room for a loaded machine)."""


@pytest.fixture
def transports(names: Names) -> Iterator[tuple[RabbitMQTransport, RabbitMQTransport]]:
    """Two broker connections: the two relays of two processes."""
    pair = (harness.transport("relay-a"), harness.transport("relay-b"))
    for transport in pair:
        transport.connect()
    declare_common(pair[0], names)
    yield pair
    for transport in pair:
        transport.close()


def _submit(engine: Engine, names: Names, count: int) -> list[int]:
    with transaction(engine) as conn:
        return [
            submit_run(
                conn, REGISTRY, "pipeline", {"text": f"t{i}"}, namespace=names.namespace
            ).run_id
            for i in range(count)
        ]


def _record_running(engine: Engine, run_id: int) -> int:
    """A later event of the run (as a scheduler's claim records it); returns its id."""
    with transaction(engine) as conn:
        store_events.record(
            conn,
            [store_events.Event(run_id=run_id, entity="run", to_state=RunState.RUNNING, actor="t")],
        )
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(events.c.id)
                .where(events.c.run_id == run_id, events.c.to_state == RunState.RUNNING)
                .order_by(events.c.id.desc())
                .limit(1)
            ).scalar_one()
        )


def _pending_event(engine: Engine, run_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(events.c.id).where(
                    events.c.run_id == run_id,
                    events.c.entity == "run",
                    events.c.to_state == RunState.PENDING,
                )
            ).scalar_one()
        )


def _published(engine: Engine, event_id: int) -> Callable[[], bool]:
    def check() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(select(events.c.published).where(events.c.id == event_id)).scalar_one()
            )

    return check


def _drive(
    duty: RelayDuty, transport: RabbitMQTransport, done: Callable[[], bool], *, limit: float = 5.0
) -> float:
    """Run the duty as the scheduler's loop does (each pass at its `due`, or sooner when it
    says so; the broker's confirms arrive while the transport processes I/O in between)
    until `done`; returns the seconds it took (`limit` if never)."""
    started = time.monotonic()
    while not done():
        now = time.monotonic()
        if now - started >= limit:
            return limit
        sleep = duty.run(now)
        transport.process(max(0.0, min(sleep, duty.due - time.monotonic(), 0.05)))
    return time.monotonic() - started


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


def test_an_event_held_back_goes_out_soon_after_its_predecessor_is_marked(
    engine: Engine, names: Names, transports: tuple[RabbitMQTransport, RabbitMQTransport]
) -> None:
    """Relay A holds a run's `pending` event in flight; B's pass meanwhile holds back the
    run's `running` event. Once A marks its batch, B publishes the held-back event within
    milliseconds, after A's, once: not at B's next interval."""
    queue = harness.bind_status_queue(names)
    (run_id,) = _submit(engine, names, 1)
    holder = Relay(engine, transports[0], names)
    assert holder.start() == 1
    assert holder.in_flight
    later = _record_running(engine, run_id)

    relay = Relay(engine, transports[1], names)
    duty = RelayDuty(relay, interval=INTERVAL)
    duty.run(time.monotonic())  # the pass after the event was recorded: it holds it back
    assert not _published(engine, later)()
    assert relay.held_back

    holder.flush()
    took = _drive(duty, transports[1], _published(engine, later))

    assert took < BOUND, f"held-back event published after {took:.3f}s"
    assert _event_ids(queue) == [_pending_event(engine, run_id), later]


def test_an_event_held_back_by_a_batch_in_flight_goes_out_once_that_batch_is_marked(
    engine: Engine, names: Names, transports: tuple[RabbitMQTransport, RabbitMQTransport]
) -> None:
    """B's pass publishes another run's event and holds back the first run's `running`: its
    batch, in flight, keeps that event locked (no other relay sees it) until marked. Once A
    and then B's batch are marked, B publishes it within milliseconds."""
    queue = harness.bind_status_queue(names)
    first_run, other_run = _submit(engine, names, 2)
    holder = Relay(engine, transports[0], names)
    with transaction(engine) as conn:  # A takes the first run's `pending` only
        conn.execute(select(events.c.id).where(events.c.run_id == other_run).with_for_update())
        assert holder.start() == 1
    later = _record_running(engine, first_run)

    relay = Relay(engine, transports[1], names)
    duty = RelayDuty(relay, interval=INTERVAL)
    assert not relay.in_flight
    duty.run(time.monotonic())  # publishes the other run's event, holds `later` back
    assert relay.in_flight
    assert not relay.held_back  # its transaction still holds `later`

    holder.flush()
    took = _drive(duty, transports[1], _published(engine, later))

    assert took < BOUND, f"held-back event published after {took:.3f}s"
    ids = _event_ids(queue)
    assert len(ids) == len(set(ids)) == 3  # each once
    assert ids.index(later) > ids.index(_pending_event(engine, first_run))


def test_a_pass_tells_when_it_held_events_back(
    engine: Engine, names: Names, transports: tuple[RabbitMQTransport, RabbitMQTransport]
) -> None:
    """`relay_pass` (the submitter's relay) says when it held events back, so its caller can
    relay again soon; a pass that held nothing back says so too."""
    (run_id,) = _submit(engine, names, 1)
    holder = Relay(engine, transports[0], names)
    assert holder.start() == 1
    _record_running(engine, run_id)

    assert relay_pass(engine, transports[1], names) == (0, True)
    holder.flush()
    assert relay_pass(engine, transports[1], names) == (1, False)
