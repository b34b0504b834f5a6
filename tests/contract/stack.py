"""One store/transport pair for the engine contract suite: where the state lives, how the
roles talk, and a transport-neutral way for the test to watch queues."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from sasflow.agents.agent import Agent
from sasflow.agents.worker import AgentWorker
from sasflow.errors import PublishError
from sasflow.registry import Registry
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.submitter import Submitter
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.base import Outgoing, Transport
from sasflow.transport.factory import make_transport
from sasflow.transport.memory import MemoryBroker
from sasflow.transport.topology import Names

PAIRS = [
    ("sqlite", "memory"),
    ("sqlite", "rabbitmq"),
    ("postgresql", "memory"),
    ("postgresql", "rabbitmq"),
]


def sqlite_template(directory: Path) -> Path:
    """A SQLite file migrated to head, to be copied by each test."""
    path = directory / "template.db"
    engine = make_engine(f"sqlite:///{path}", pool_size=1)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    return path


def sqlite_copy(template: Path, directory: Path) -> str:
    path = directory / "store.db"
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@dataclass
class Stack:
    """The roles of one test, wired to one store and one transport implementation."""

    store: str
    bus: str
    database_url: str
    engine: Engine
    names: Names
    broker_url: str
    broker: MemoryBroker | None

    @property
    def label(self) -> str:
        return f"{self.store}+{self.bus}"

    def transport(self, role: str) -> Transport:
        return make_transport(self.broker_url, process_name=f"contract-{role}", broker=self.broker)

    def scheduler(self, registry: Registry, **options: Any) -> Scheduler:
        return Scheduler(
            self.engine,
            self.transport("scheduler"),
            registry,
            self.names,
            database_url=self.database_url,
            options=SchedulerOptions(**options),
        )

    def agent(self, agent: Agent, concurrency: int = 4) -> AgentWorker:
        return AgentWorker(
            agent, self.transport(f"agent-{agent.name}"), self.names, concurrency=concurrency
        )

    def submitter(self, registry: Registry) -> Submitter:
        return Submitter(self.engine, self.transport("submitter"), registry, self.names)

    def supervisor(self, **options: Any) -> Supervisor:
        return Supervisor(
            self.engine,
            self.names,
            transport=self.transport("supervisor"),
            options=SupervisorOptions(**options),
        )


class Observer:
    """The test's own connection to the bus: publish raw messages, bind and drain queues."""

    def __init__(self, stack: Stack) -> None:
        self._transport = stack.transport("observer")
        self._transport.connect()

    def close(self) -> None:
        self._transport.close()

    def declare_bound_queue(self, queue: str, exchange: str, routing_key: str) -> None:
        self._transport.declare_exchange(exchange, "topic")
        self._transport.declare_queue(queue, dead_letter_exchange=None)
        self._transport.bind_queue(queue, exchange, routing_key)

    def publish(self, queue: str, body: bytes, timeout: float = 15.0, **properties: Any) -> None:
        """Publish to `queue` (mandatory), retrying until the role that owns it declared it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._transport.publish(
                    Outgoing(
                        exchange="", routing_key=queue, body=body, mandatory=True, **properties
                    )
                )
            except PublishError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            else:
                return

    def take(
        self, queue: str, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0
    ) -> list[dict[str, Any]]:
        """Messages of `queue` (JSON bodies, plus `_headers`) until `until` holds or timeout."""
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while not until(found) and time.monotonic() < deadline:
            delivery = self._transport.get(queue)
            if delivery is None:
                time.sleep(0.02)
                continue
            self._transport.ack(delivery)
            try:
                message = json.loads(delivery.body)
            except ValueError:
                message = {"_raw": delivery.body}
            if not isinstance(message, dict):
                message = {"_raw": message}
            message["_headers"] = dict(delivery.headers)
            found.append(message)
        return found
