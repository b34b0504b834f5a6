"""`sasflow namespace delete` on RabbitMQ: a namespace declared as the roles declare it, with
messages in an agent's queue, is listed by --dry-run (nothing deleted), refused while a queue
has a consumer, and deleted with --yes; the database is never needed (--no-store)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from click.testing import CliRunner, Result

from sasflow.cli.main import cli
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import (
    Names,
    declare_agent_queue,
    declare_breaker_queue,
    declare_common,
)
from tests import services

pytestmark = pytest.mark.integration


@pytest.fixture
def declared(names: Names) -> Names:
    """The namespace as a scheduler and an `echo` agent declare it, 2 requests waiting."""
    transport = RabbitMQTransport(services.broker_url(), process_name="test-namespace")
    transport.connect()
    try:
        declare_common(transport, names)
        declare_agent_queue(transport, names, "echo")
        declare_breaker_queue(transport, names, "echo", "i1")
    finally:
        transport.close()
    with services.broker_channel() as channel:
        for body in (b"1", b"2"):
            channel.basic_publish("", names.agent("echo"), body)
    return names


def _sasflow(*args: str, exit_code: int = 0) -> Result:
    result = CliRunner().invoke(cli, list(args), env={"SASFLOW_BROKER_URL": services.broker_url()})
    assert result.exit_code == exit_code, result.output
    return result


def _delete(names: Names, *flags: str, exit_code: int = 0) -> Result:
    return _sasflow(
        "namespace",
        "delete",
        names.namespace,
        "--no-store",
        "--agent",
        "echo",
        "--agent",
        "echo:gpu",
        *flags,
        exit_code=exit_code,
    )


def _exists(names: Names) -> dict[str, bool]:
    found = {}
    for queue in names.all_queues(["echo"]):
        found[queue] = services.queue_exists(queue)
    return found


def test_dry_run_lists_refuses_while_consumed_then_deletes_with_yes(declared: Names) -> None:
    names = declared
    _delete(names, exit_code=2)  # neither --dry-run nor --yes

    listed: Any = json.loads(_delete(names, "--dry-run", "-o", "json").output)["would_delete"]
    queues = {q["queue"]: q["messages"] for q in listed["queues"]}
    assert queues == {
        names.submit: 0,
        names.events: 0,
        names.replies: 0,
        names.dead_letter_queue: 0,
        names.dead_requests: 0,
        names.fleet: 0,
        names.agent("echo"): 2,
    }, "the pool queue that was never declared is left out"
    assert set(listed["exchanges"]) == {
        names.status,
        names.alerts,
        names.dead_letter_exchange,
        names.fleet,
        names.control,
        names.breakers("echo"),
    }
    assert all(_exists(names).values()), "a dry run deletes nothing"

    with _consumer(names.agent("echo")):
        refused = _delete(names, "--yes", exit_code=1)
        assert "have consumers" in refused.output
        assert names.agent("echo") in refused.output
        assert all(_exists(names).values()), "refused: nothing deleted"

    deleted = _delete(names, "--yes").output
    assert f"namespace {names.namespace}: deleted 7 queue(s)" in deleted
    assert not any(_exists(names).values())


@contextlib.contextmanager
def _consumer(queue: str) -> Iterator[None]:
    connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
    try:
        channel = connection.channel()
        channel.basic_consume(queue, lambda *_: None)
        yield
    finally:
        connection.close()
