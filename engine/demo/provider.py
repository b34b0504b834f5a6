"""The demo's payment provider: it confirms each charge with a `payment_confirmed` event, sent
a short random delay after the charge through the door a real partner uses (a message on
`<ns>.events`; docs/protocol.md, "Events").

The event's id is `pay-<order_id>`: whoever sends the confirmation of an order again (a charge
retried, the early confirmation below) sends the same event, which is stored once. The demo
confirms one order before it is even placed (`Scenario.early`): that event waits, unmatched,
until the order's wait opens (stored-first matching). It never confirms the orders it is told
to withhold (`Scenario.unconfirmed`): their waits time out.
"""

from __future__ import annotations

import heapq
import json
import random
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from sasflow.errors import PublishError
from sasflow.transport.base import Outgoing, Transport
from sasflow.transport.topology import Names, declare_common

EVENT = "payment_confirmed"
"""The event the order workflows wait for after the charge."""
DELAY = (0.1, 0.8)
"""Seconds between a charge and its confirmation, uniformly drawn per order."""
RETENTION_S = 600.0
"""An unmatched confirmation is kept this long for its wait to open."""

ChargeHook = Callable[[str, int], None]
"""Told of each successful charge: the order's id and the amount."""


def confirmation(order_id: str, amount: int) -> dict[str, Any]:
    """The event document (docs/protocol.md 4.8) confirming the payment of an order."""
    return {
        "name": EVENT,
        "correlation": order_id,
        "id": f"pay-{order_id}",
        "payload": {"order_id": order_id, "amount": amount, "status": "confirmed"},
        "retention": RETENTION_S,
    }


def event_message(names: Names, body: dict[str, Any]) -> Outgoing:
    """`body` as a message to `<ns>.events` (default exchange, mandatory)."""
    return Outgoing("", names.events, json.dumps(body).encode(), mandatory=True)


def publish_confirmations(transport: Transport, names: Names, bodies: list[dict[str, Any]]) -> int:
    """Publish the confirmations on a connected transport; returns how many the broker
    refused (none, unless the events queue is missing)."""
    declare_common(transport, names)
    results = transport.publish_many([event_message(names, body) for body in bodies])
    return sum(1 for r in results if r is not None)


class PaymentProvider:
    """A role of the demo (LocalRunner): publishes each confirmation when it is due."""

    def __init__(
        self, transport: Transport, names: Names, seed: int, *, withhold: Collection[str] = ()
    ) -> None:
        self._transport = transport
        self._withhold = frozenset(withhold)
        self.withheld = 0
        self._names = names
        self._seed = seed
        self._due: list[tuple[float, int, dict[str, Any]]] = []
        self._sequence = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.sent = 0

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def confirm(self, order_id: str, amount: int, *, delay: float | None = None) -> None:
        """Send the confirmation of `order_id` after `delay` seconds (by default a random
        delay seeded by the order's id, so a retried charge confirms at the same time); never
        for an order it withholds."""
        if order_id in self._withhold:
            with self._lock:
                self.withheld += 1
            return
        if delay is None:
            rng = random.Random(f"{self._seed}:pay:{order_id}")  # noqa: S311 - simulation
            delay = rng.uniform(*DELAY)
        with self._lock:
            self._sequence += 1
            item = (time.monotonic() + delay, self._sequence, confirmation(order_id, amount))
            heapq.heappush(self._due, item)
        self._wake.set()

    def _take_due(self) -> tuple[list[dict[str, Any]], float]:
        """The confirmations due now, and the seconds until the next one."""
        now = time.monotonic()
        due = []
        with self._lock:
            while self._due and self._due[0][0] <= now:
                due.append(heapq.heappop(self._due)[2])
            wait = self._due[0][0] - now if self._due else 1.0
        return due, wait

    def run(self) -> None:
        self._transport.connect()
        try:
            declare_common(self._transport, self._names)
            while not self._stop.is_set():
                self._wake.clear()
                due, wait = self._take_due()
                if due:
                    messages = [event_message(self._names, body) for body in due]
                    refused = [e for e in self._transport.publish_many(messages) if e]
                    if refused:
                        raise PublishError(f"payment confirmation refused: {refused[0]}")
                    self.sent += len(due)
                    continue
                self._wake.wait(min(wait, 0.5))
        finally:
            self._transport.close()
