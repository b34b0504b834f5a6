"""One transport implementation under contract test: connected transports on a test namespace."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names


@dataclass
class Bus:
    """Transports of one implementation (`kind`) sharing one broker and namespace."""

    kind: str
    names: Names
    make: Callable[[str], Transport]
    delete_queue: Callable[[str], None]
    """Delete a queue from outside the transports under test (an operator, a node lost)."""
    opened: list[Transport] = field(default_factory=list)
    named: list[str] = field(default_factory=list)

    def transport(self, role: str = "test") -> Transport:
        transport = self.make(role)
        transport.connect()
        self.opened.append(transport)
        return transport

    def name(self, suffix: str) -> str:
        """A queue or exchange name of the test's namespace (deleted after the test)."""
        name = f"{self.names.namespace}.{suffix}"
        self.named.append(name)
        return name

    def close(self) -> None:
        for transport in self.opened:
            transport.close()


def take(transport: Transport, queue: str, timeout: float = 10.0) -> Delivery:
    """The next message of `queue` (unacked), waiting for it to arrive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivery = transport.get(queue)
        if delivery is not None:
            return delivery
        time.sleep(0.02)
    raise AssertionError(f"nothing arrived in {queue} within {timeout}s")


def take_all(transport: Transport, queue: str) -> list[Delivery]:
    """Every message `queue` holds now, acked."""
    found = []
    while (delivery := transport.get(queue)) is not None:
        transport.ack(delivery)
        found.append(delivery)
    return found


def pump(transports: Iterable[Transport], until: Callable[[], bool], timeout: float = 10.0) -> None:
    """Run `process` on each transport (all owned by the calling thread) until `until()`."""
    owned = list(transports)
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        for transport in owned:
            transport.process(0.02)


def settle(transports: Iterable[Transport], seconds: float = 0.3) -> None:
    """Let deliveries that would (wrongly) still arrive arrive: process for `seconds`."""
    owned = list(transports)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for transport in owned:
            transport.process(0.02)
