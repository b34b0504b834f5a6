"""A publisher that outlives broker restarts, and the end-of-run dead-letter drain.

Each thread that publishes owns one `Publisher` (pika connections are not thread-safe). Both
take a broker list (`url1,url2,...`, as SASFLOW_BROKER_URL does) and connect to the nodes in a
new random order each time, so that a node that is down costs one failed attempt.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions

from sasflow.urllist import split_urls

AMQP_ERRORS = (pika.exceptions.AMQPError, OSError)
"""What a publish may raise while the broker restarts or is killed."""


def parameters(url: str) -> list[pika.URLParameters]:
    """One set of connection parameters per node of the broker list `url`."""
    found = []
    for entry in split_urls(url):
        params = pika.URLParameters(entry)
        params.connection_attempts = 1
        params.socket_timeout = 5
        params.blocked_connection_timeout = 10
        found.append(params)
    return found


def connect(url: str) -> pika.BlockingConnection:
    """A connection to the first node of the list, in a random order, that accepts one."""
    nodes = parameters(url)
    return pika.BlockingConnection(random.sample(nodes, len(nodes)))


class Publisher:
    """Confirmed, persistent publishes to the default exchange, reconnecting as needed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connection: pika.BlockingConnection | None = None
        self.channel: Any = None

    def _ensure(self) -> Any:
        if (
            self.connection is None
            or self.connection.is_closed
            or self.channel is None
            or self.channel.is_closed
        ):
            self.close()
            self.connection = connect(self.url)
            self.channel = self.connection.channel()
            self.channel.confirm_delivery()
        return self.channel

    def publish(
        self,
        queue: str,
        body: bytes,
        *,
        headers: dict[str, Any] | None = None,
        deadline: float,
        correlation_id: str | None = None,
    ) -> bool:
        """Publish until the broker confirms it or `deadline` (monotonic) passes."""
        properties = pika.BasicProperties(
            content_type="application/json",
            delivery_mode=2,
            headers=headers,
            correlation_id=correlation_id,
        )
        while time.monotonic() < deadline:
            try:
                self._ensure().basic_publish("", queue, body, properties, mandatory=True)
            except pika.exceptions.UnroutableError:
                # The queue does not exist yet (fresh broker): the roles declare it.
                time.sleep(0.5)
            except AMQP_ERRORS:
                self.close()
                time.sleep(0.5)
            else:
                return True
        return False

    def close(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(*AMQP_ERRORS):
                if self.connection.is_open:
                    self.connection.close()
        self.connection = None
        self.channel = None


@dataclass(frozen=True)
class DeadLetter:
    headers: dict[str, Any]
    body: bytes


def drain(url: str, queue: str, *, timeout: float = 30.0) -> list[DeadLetter]:
    """Take every message of `queue` (the namespace's `.dead`, which nobody consumes)."""
    found: list[DeadLetter] = []
    deadline = time.monotonic() + timeout
    with contextlib.closing(connect(url)) as connection:
        channel = connection.channel()
        while time.monotonic() < deadline:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            found.append(
                DeadLetter(
                    dict((properties.headers if properties else None) or {}),
                    body.encode() if isinstance(body, str) else body or b"",
                )
            )
    return found
