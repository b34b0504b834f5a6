"""The broker commands the operator docs show, run on a dead-letter queue of the test's own."""

from __future__ import annotations

import shutil
import subprocess

import pika
import pytest

from sasflow.transport.topology import Names
from tests import services
from tests.docs.markdown import shell_commands

pytestmark = pytest.mark.integration

PAGES = ("docs/operations.md", "docs/protocol.md")


def _depth(listing: str, queue: str) -> tuple[int, int]:
    """(messages, consumers) of `queue` in `rabbitmqctl list_queues name messages consumers`."""
    for line in listing.splitlines():
        fields = line.split("\t")
        if fields[0] == queue:
            return int(fields[1]), int(fields[2])
    raise AssertionError(f"{queue} not listed:\n{listing}")


def test_rabbitmq_commands_of_operations(names: Names) -> None:
    """`rabbitmqctl list_queues name messages consumers` shows the dead-letter queue's depth
    and `rabbitmqctl purge_queue <ns>.dead` empties it, as operations.md and protocol.md say."""
    ctl = shutil.which("rabbitmqctl")
    assert ctl is not None, "rabbitmqctl is not installed next to the broker"
    shown = {tuple(argv) for page in PAGES for argv in shell_commands(page, "rabbitmqctl")}
    assert shown == {
        ("rabbitmqctl", "list_queues", "name", "messages", "consumers"),
        ("rabbitmqctl", "purge_queue", "sasflow.dead"),
    }
    dead = names.dead_letter_queue
    with services.broker_channel() as channel:
        channel.queue_declare(dead, durable=True)
        for n in range(2):
            channel.basic_publish(
                "", dead, f"poison {n}".encode(), pika.BasicProperties(delivery_mode=2)
            )

    def run(argv: tuple[str, ...]) -> str:
        own = [dead if word == "sasflow.dead" else word for word in argv[1:]]
        done = subprocess.run([ctl, *own], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listing = ("rabbitmqctl", "list_queues", "name", "messages", "consumers")
    assert _depth(run(listing), dead) == (2, 0)
    run(("rabbitmqctl", "purge_queue", "sasflow.dead"))
    assert _depth(run(listing), dead) == (0, 0)
