"""Quorum work queues on the real broker: the whole pipeline on them, poison requests bounded
by the delivery limit, and `sasflow queues migrate` moving a classic deployment without losing
a message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pika
import pika.exceptions
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from sasflow.agents.worker import AgentWorker
from sasflow.cli.main import cli
from sasflow.errors import BrokerUnavailableError
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.transport.base import Outgoing
from sasflow.transport.connection import BrokerOptions
from sasflow.transport.migration import (
    HOLDING_SUFFIX,
    MigrationRefusedError,
    QueueMigration,
    work_queues,
)
from sasflow.transport.queues import QueueOptions, QueueType, queue_arguments
from sasflow.transport.rabbitmq import PRECONDITION_FAILED, RabbitMQTransport
from sasflow.transport.topology import FLEET_MAX, Names, declare_agent_queue, declare_common
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

QUORUM = QueueOptions(type=QueueType.QUORUM, delivery_limit=2)


def _transport(role: str, queues: QueueOptions) -> RabbitMQTransport:
    return RabbitMQTransport(
        services.broker_url(), process_name=f"test-{role}", options=BrokerOptions(queues=queues)
    )


def _has_type(
    name: str, options: QueueOptions, *, dead_letter: str | None, max_length: int | None = None
) -> bool:
    """Whether `name` accepts a redeclaration with `options`' arguments (a queue's type is
    one of its arguments: a mismatch is refused with 406)."""
    arguments = queue_arguments(
        options, work=True, dead_letter_exchange=dead_letter, max_length=max_length
    )
    with services.broker_channel() as channel:
        try:
            channel.queue_declare(name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != PRECONDITION_FAILED:
                raise
            return False
    return True


def _take(queue: str, limit: int = 100) -> list[tuple[bytes, dict[str, Any]]]:
    """The bodies and headers of the messages in `queue`, taken (acked)."""
    taken: list[tuple[bytes, dict[str, Any]]] = []
    with services.broker_channel() as channel:
        for _ in range(limit):
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            taken.append((cast(bytes, body), dict(props.headers or {}) if props else {}))
    return taken


@pytest.fixture
def classic_deployment(names: Names) -> Iterator[Names]:
    """A namespace whose queues were declared classic (as before this setting existed)."""
    transport = _transport("classic", QueueOptions())
    transport.connect()
    try:
        declare_common(transport, names)
        declare_agent_queue(transport, names, "echo")
    finally:
        transport.close()
    yield names
    with services.broker_channel() as channel:
        channel.queue_delete(names.agent("echo"))
        for queue in work_queues(names, [names.agent("echo")]):
            channel.queue_delete(queue.name + HOLDING_SUFFIX)


def test_a_run_completes_on_quorum_queues_and_they_are_quorum(
    engine: Engine, database_url: str, names: Names
) -> None:
    run_id = harness.submit(
        engine, basic.registry, names, "pipeline", key="q-1", run_input={"text": "quorum"}
    )
    scheduler = Scheduler(
        engine,
        _transport("scheduler", QUORUM),
        basic.registry,
        names,
        database_url=database_url,
        options=SchedulerOptions(),
    )
    agent = AgentWorker(basic.echo, _transport("agent", QUORUM), names)
    with harness.running(scheduler, agent):
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")
    assert harness.run_states(engine) == {run_id: "completed"}
    dlx = names.dead_letter_exchange
    for queue, dead_letter in (
        (names.submit, dlx),
        (names.replies, dlx),
        (names.agent("echo"), dlx),
        (names.dead_letter_queue, None),
    ):
        assert _has_type(queue, QUORUM, dead_letter=dead_letter), queue
        assert not _has_type(queue, QueueOptions(), dead_letter=dead_letter), queue
    # The fleet queue too: every role declares it when it connects, so on a cluster it must
    # outlive the loss of a node as the work queues do.
    assert _has_type(names.fleet, QUORUM, dead_letter=None, max_length=FLEET_MAX)
    assert not _has_type(names.fleet, QueueOptions(), dead_letter=None, max_length=FLEET_MAX)


def test_a_request_that_keeps_coming_back_is_dead_lettered_at_the_delivery_limit(
    names: Names,
) -> None:
    """A request that crashes its agent every time (here: requeued by hand) is dead-lettered
    after `delivery_limit` deliveries, into the supervisor's copy, where it is counted."""
    transport = _transport("poison", QUORUM)
    transport.connect()
    try:
        declare_common(transport, names)
        declare_agent_queue(transport, names, "echo")
    finally:
        transport.close()
    body = json.dumps({"step_id": 1, "attempt": 1}).encode()
    harness.publish_raw(names.agent("echo"), body)
    deliveries = 0
    with services.broker_channel() as channel:
        for _ in range(10):
            method, _props, _body = channel.basic_get(names.agent("echo"))
            if method is None:
                break
            deliveries += 1
            channel.basic_nack(cast(int, method.delivery_tag), requeue=True)
        harness.wait_for(
            lambda: (
                channel.queue_declare(names.dead_requests, passive=True).method.message_count == 1
            ),
            timeout=5,
            what="the request dead-lettered",
        )
        channel.queue_delete(names.agent("echo"))
    assert deliveries == 3  # the first delivery and `delivery_limit` redeliveries
    [(dead, headers)] = _take(names.dead_requests)
    assert dead == body
    assert headers["x-first-death-reason"] == "delivery_limit"


def test_migrate_moves_every_message_to_quorum_and_is_idempotent(
    classic_deployment: Names,
) -> None:
    names = classic_deployment
    sent = {
        names.submit: [b"submission-1", b"submission-2"],
        names.replies: [b"reply-1"],
        names.agent("echo"): [b"request-1", b"request-2", b"request-3"],
        names.dead_letter_queue: [b"dead-1"],
    }
    for queue, bodies in sent.items():
        for body in bodies:
            harness.publish_raw(queue, body, headers={"x-test": queue})
    planned = work_queues(names, [names.agent("echo")])
    with QueueMigration(services.broker_url(), BrokerOptions(), QUORUM) as migration:
        migration.check_idle(planned)
        first = {m.queue: m for m in (migration.migrate(q) for q in planned)}
    assert all(m.changed for m in first.values())
    assert {q: first[q].messages for q in sent} == {q: len(b) for q, b in sent.items()}
    for queue, bodies in sent.items():
        taken = _take(queue)
        assert [body for body, _ in taken] == bodies, queue  # every message, in order
        assert {headers["x-test"] for _, headers in taken} == {queue}
    for planned_queue in planned:
        with (
            pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"),
            services.broker_channel() as channel,
        ):
            channel.queue_declare(planned_queue.name + HOLDING_SUFFIX, passive=True)
    assert _has_type(names.agent("echo"), QUORUM, dead_letter=names.dead_letter_exchange)
    with QueueMigration(services.broker_url(), BrokerOptions(), QUORUM) as migration:
        again = [migration.migrate(q) for q in planned]
    assert [(m.changed, m.messages) for m in again] == [(False, 0)] * len(planned)


def test_migrate_finishes_what_an_interrupted_run_left_in_a_holding_queue(
    classic_deployment: Names,
) -> None:
    """A run cut off after it recreated the queue leaves messages in the holding queue: the
    next run moves them back."""
    names = classic_deployment
    queue = names.agent("echo")
    holding = queue + HOLDING_SUFFIX
    with services.broker_channel() as channel:
        channel.queue_delete(queue)
        channel.queue_declare(
            holding,
            durable=True,
            arguments=queue_arguments(
                QUORUM, work=True, dead_letter_exchange=names.dead_letter_exchange
            ),
        )
    harness.publish_raw(holding, b"held-request")
    [echo] = [q for q in work_queues(names, [queue]) if q.name == queue]
    with QueueMigration(services.broker_url(), BrokerOptions(), QUORUM) as migration:
        moved = migration.migrate(echo)
    assert (moved.changed, moved.messages) == (False, 1)
    assert [body for body, _ in _take(queue)] == [b"held-request"]


def test_migrate_refuses_queues_with_consumers(classic_deployment: Names) -> None:
    names = classic_deployment
    planned = work_queues(names, [names.agent("echo")])
    with services.broker_channel() as channel:
        channel.basic_consume(names.replies, lambda *_: None)
        with (
            QueueMigration(services.broker_url(), BrokerOptions(), QUORUM) as migration,
            pytest.raises(MigrationRefusedError, match=r"replies \(1\)"),
        ):
            migration.check_idle(planned)


def test_queues_migrate_command(classic_deployment: Names, database_url: str) -> None:
    names = classic_deployment
    harness.publish_raw(names.agent("echo"), b"request")
    result = CliRunner().invoke(
        cli,
        [
            *("--broker-url", services.broker_url(), "--namespace", names.namespace),
            *("--database-url", database_url, "queues", "migrate", "--to", "quorum"),
            *("--agent", "echo", "--yes", "-o", "json"),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {r["queue"]: r for r in json.loads(result.stdout)}
    assert rows[names.agent("echo")] == {
        "queue": names.agent("echo"),
        "changed": True,
        "messages_moved": 1,
    }
    assert _has_type(
        names.agent("echo"),
        QueueOptions(type=QueueType.QUORUM),
        dead_letter=names.dead_letter_exchange,
    )


def test_a_role_whose_settings_say_quorum_uses_the_classic_queues_it_finds(
    classic_deployment: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """Settings changed before the queues were migrated: the role declares, warns and works
    on the queues as they are, instead of being refused at every reconnect; a conflict on any
    other argument is still refused."""
    names = classic_deployment
    transport = _transport("changed-settings", QUORUM)
    transport.connect()
    try:
        declare_common(transport, names)
        declare_agent_queue(transport, names, "echo")
        transport.publish(Outgoing(exchange="", routing_key=names.submit, body=b"still works"))
        with pytest.raises(BrokerUnavailableError, match="x-dead-letter-exchange"):
            transport.declare_queue(names.submit, dead_letter_exchange="another", work=True)
    finally:
        transport.close()
    assert "sasflow queues migrate" in caplog.text
    assert _has_type(names.submit, QueueOptions(), dead_letter=names.dead_letter_exchange)
    assert [body for body, _ in _take(names.submit)] == [b"still works"]
