"""The in-process bus (`memory://`): `MemoryBroker` (`broker.py`) reproduces what the roles rely
on from RabbitMQ (docs/protocol.md, "In-process bus"), `MemoryTransport` (`transport.py`) is one
role's connection to it, `model.py` the queues, exchanges and messages it keeps."""

from sasflow.transport.memory.broker import MemoryBroker
from sasflow.transport.memory.transport import MemoryTransport

__all__ = ["MemoryBroker", "MemoryTransport"]
