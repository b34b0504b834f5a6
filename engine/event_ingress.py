"""The `<ns>.events` queue (docs/protocol.md, "Events"): inbound events for event waits, consumed
by the submitter role next to `<ns>.submit`. Each message is one event document (`{name,
correlation, id, payload?, retention?}`), stored idempotently and matched with its wait
(ops/events.py) in a transaction of its own, acked after the commit; a message that is not an
event is dead-lettered with the reason, never dropped. A redelivery is harmless: the same
(name, id) is the same event.
"""

from __future__ import annotations

import logging

from sasflow.errors import InvalidEventError, InvalidMessageError
from sasflow.messages import DEFAULT_LIMITS, Limits, loads
from sasflow.ops import events as event_ops
from sasflow.registry import Registry
from sasflow.store.db import Engine, transaction
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)


class EventIngress:
    """Holds deliveries of `<ns>.events` (`on_delivery`, the consumer's callback) and stores
    them (`drain`, from the role's loop)."""

    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        registry: Registry,
        names: Names,
        *,
        actor: str,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._engine = engine
        self._transport = transport
        self._registry = registry
        self._names = names
        self._actor = actor
        self._limits = limits
        self.held: list[Delivery] = []
        self.stored = 0
        self.dead_lettered = 0

    def consume(self, prefetch: int) -> None:
        """Consume `<ns>.events` (declared with the common names, transport.topology)."""
        self._transport.consume(self._names.events, self.on_delivery, prefetch=prefetch)

    def on_delivery(self, delivery: Delivery) -> None:
        self.held.append(delivery)

    def drain(self) -> None:
        """Store the held events, one transaction each; an error of the store leaves the rest
        held (and raises: the role reconnects, the broker delivers them again)."""
        while self.held:
            delivery = self.held[0]
            try:
                body = loads(delivery.body, self._limits, what="event")
                with transaction(self._engine) as conn:
                    event_ops.send_event(
                        conn,
                        body,
                        source="amqp",
                        namespace=self._names.namespace,
                        actor=self._actor,
                        registry=self._registry,
                    )
            except (InvalidMessageError, InvalidEventError) as exc:
                field = f" ({exc.field})" if isinstance(exc, InvalidEventError) else ""
                self._transport.dead_letter(
                    delivery,
                    f"invalid event{field}: {exc}",
                    dead_letter_exchange=self._names.dead_letter_exchange,
                )
                self.dead_lettered += 1
            else:
                self._transport.ack(delivery)
                self.stored += 1
            self.held.pop(0)
