"""An agent process's control queue (sasflow.agents.cancels): one for the process's life, so
a cancel published while it reconnects waits there, and one of the connection's own when the
process's queue cannot be declared again (a classic queue whose cluster node is down)."""

from __future__ import annotations

from typing import Any

from sasflow.agents.cancels import Cancels
from sasflow.agents.jobs import AgentStats
from sasflow.errors import BrokerUnavailableError
from sasflow.messages import Cancel
from sasflow.transport.base import Outgoing
from sasflow.transport.memory.broker import MemoryBroker
from sasflow.transport.memory.transport import MemoryTransport
from sasflow.transport.topology import Names

INSTANCE = "worker:host:1:abc123"


class Declares(MemoryTransport):
    """Records the queues consumed; refuses to declare the names in `refused`."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker, process_name="agent")
        self.consumed: list[str] = []
        self.refused: set[str] = set()

    def declare_queue(self, name: str, **options: Any) -> None:
        if name in self.refused:
            raise BrokerUnavailableError(f"NOT_FOUND - home node of queue {name!r} is down")
        super().declare_queue(name, **options)

    def consume(self, queue: str, handler: Any, *, prefetch: int) -> None:
        self.consumed.append(queue)
        super().consume(queue, handler, prefetch=prefetch)


def _unparsable(*_: object) -> None:
    raise AssertionError("no message here is unparsable")


def _cancels(transport: MemoryTransport, names: Names) -> Cancels:
    return Cancels(
        INSTANCE,
        "worker",
        transport,
        names=names,
        jobs={},
        stats=AgentStats(),
        dead_letter=_unparsable,
    )


def test_a_cancel_published_between_two_connections_is_received_after_the_second() -> None:
    broker, names = MemoryBroker(), Names("t")
    transport = Declares(broker)
    cancels = _cancels(transport, names)
    transport.connect()
    cancels.connected()
    transport.close()  # the connection is lost
    sender = MemoryTransport(broker, process_name="relay")
    sender.connect()
    cancel = Cancel(step_id=7, run_id=3, attempt=1, agent="worker", reason="asked")
    sender.publish(Outgoing(names.control, "worker", cancel.encode()))
    transport.connect()
    cancels.connected()
    transport.process(0.1)
    assert cancels.cancelled(7, 1)
    assert transport.consumed == [names.control_queue("worker", "abc123")] * 2


def test_a_process_whose_queue_cannot_be_declared_again_consumes_one_of_the_connection() -> None:
    broker, names = MemoryBroker(), Names("t")
    transport = Declares(broker)
    cancels = _cancels(transport, names)
    transport.connect()
    cancels.connected()
    transport.refused.add(names.control_queue("worker", "abc123"))
    transport.connect()
    cancels.connected()
    assert transport.consumed == [
        names.control_queue("worker", "abc123"),
        names.control_queue("worker", "abc123-2"),
    ]
