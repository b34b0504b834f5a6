"""Simulated remote services (warehouse, payment gateway, carrier) with seeded trouble.

Every call is slow by a random few milliseconds; the payment gateway fails transiently now and
then (the agent retries inside the deadline); the warehouse goes down for a while (the
agent's circuit breaker opens); and the orders the scenario marks fail the way it says. The
randomness of one call depends only on the seed, the idempotency key and the try number, so a
run is reproducible whatever the thread interleaving. Each service is idempotent on the key,
as a real one should be.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sasflow.agents import PermanentError
from sasflow.demo.scenario import DECLINED_CARD, GATEWAY_TIMEOUTS, UNDELIVERABLE, Scenario

TRANSIENT_RATE = 0.1
"""Share of payment gateway calls that fail with a connection error."""
LATENCY = (0.005, 0.04)
"""Seconds every remote call takes, uniformly drawn."""


@dataclass(frozen=True)
class Happening:
    """Something the simulated world did that the store cannot show (it happened in an agent)."""

    kind: str
    message: str


@dataclass
class Happenings:
    """A thread-safe feed of happenings and their counts, read by the demo's display."""

    _items: collections.deque[Happening] = field(default_factory=collections.deque)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, message: str) -> None:
        with self._lock:
            self._items.append(Happening(kind, message))
            self.counts[kind] += 1

    def take(self) -> list[Happening]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def snapshot(self) -> dict[str, int]:
        """The counts by kind so far."""
        with self._lock:
            return dict(sorted(self.counts.items()))


class RemoteServices:
    """The three remote services of one agent process, sharing the scenario and a feed."""

    def __init__(self, scenario: Scenario, feed: Happenings | None = None) -> None:
        self.scenario = scenario
        self.feed = feed or Happenings()
        self._lock = threading.Lock()
        self._tries: collections.Counter[str] = collections.Counter()
        self._done: dict[str, dict[str, Any]] = {}
        self._reserve_calls = 0
        self._down_until: float | None = None
        self._back = False

    def _try(self, service: str, key: str) -> tuple[int, random.Random]:
        """This call's try number for `key` and its own random generator."""
        with self._lock:
            self._tries[f"{service}:{key}"] += 1
            number = self._tries[f"{service}:{key}"]
        seed = f"{self.scenario.seed}:{service}:{key}:{number}"
        return number, random.Random(seed)  # noqa: S311 - a simulation, not security

    def _slow(self, rng: random.Random, remaining: float) -> None:
        time.sleep(min(max(remaining, 0.0), rng.uniform(*LATENCY)))

    def _once(self, service: str, key: str, result: dict[str, Any]) -> dict[str, Any]:
        """The result of the first successful call for `key` (the service is idempotent)."""
        with self._lock:
            return self._done.setdefault(f"{service}:{key}", result)

    # -- warehouse ----------------------------------------------------------------------------

    def _warehouse_up(self) -> bool:
        now = time.monotonic()
        with self._lock:
            self._reserve_calls += 1
            if self._down_until is None and self._reserve_calls >= self.scenario.outage_at:
                self._down_until = now + self.scenario.outage_seconds
                went_down = True
            else:
                went_down = False
            down = self._down_until is not None and now < self._down_until
            came_back = not down and self._down_until is not None and not self._back
            if came_back:
                self._back = True
        if came_back:
            self.feed.add("outage", "warehouse is reachable again")
        if went_down:
            self.feed.add("outage", f"warehouse went down for {self.scenario.outage_seconds:g}s")
        return not down

    def reserve(self, key: str, sku: str, qty: int, remaining: float) -> dict[str, Any]:
        _, rng = self._try("reserve", key)
        self._slow(rng, remaining)
        if not self._warehouse_up():
            raise ConnectionError("warehouse unreachable")
        return self._once("reserve", key, {"reservation": f"R-{key[:8]}", "sku": sku, "qty": qty})

    def release(self, key: str, reservation: str, remaining: float) -> dict[str, Any]:
        _, rng = self._try("release", key)
        self._slow(rng, remaining)
        return self._once("release", key, {"released": reservation})

    # -- payment gateway ----------------------------------------------------------------------

    def charge(
        self, key: str, amount: int, card: str, trouble: str | None, remaining: float
    ) -> dict[str, Any]:
        number, rng = self._try("charge", key)
        self._slow(rng, remaining)
        if trouble == GATEWAY_TIMEOUTS and number <= 3:
            self.feed.add("transient", f"payment gateway timed out (try {number})")
            raise TimeoutError("payment gateway timed out")
        if rng.random() < TRANSIENT_RATE:
            self.feed.add("transient", "payment gateway connection reset")
            raise ConnectionError("payment gateway connection reset")
        if card == DECLINED_CARD:
            raise PermanentError("card declined by the issuer")
        return self._once("charge", key, {"charge": f"CH-{key[:8]}", "amount": amount})

    def refund(self, key: str, charge: str, amount: int, remaining: float) -> dict[str, Any]:
        _, rng = self._try("refund", key)
        self._slow(rng, remaining)
        return self._once("refund", key, {"refunded": charge, "amount": amount})

    # -- carrier ------------------------------------------------------------------------------

    def ship(self, key: str, address: str, remaining: float) -> dict[str, Any]:
        _, rng = self._try("ship", key)
        self._slow(rng, remaining)
        if address == UNDELIVERABLE:
            raise PermanentError(f"carrier cannot deliver to {address!r}")
        return self._once("ship", key, {"tracking": f"TRK-{key[:10].upper()}"})
