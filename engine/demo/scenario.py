"""The demo's orders and the trouble each one meets, all derived from a seed.

The trouble is written into the order's input (a declined test card, an address the carrier
refuses, a `trouble` note), so `sasflow runs show` explains every outcome afterwards.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

DEFAULT_ORDERS = 40
DEFAULT_SEED = 7
MIN_ORDERS = 6
"""Enough orders for every designed phenomenon to happen to a different one."""

DECLINED_CARD = "4000000000000002"
"""The card number payment test modes decline."""
GOOD_CARD = "4242424242424242"
UNDELIVERABLE = "1 Nowhere Lane, Atlantis"

GATEWAY_TIMEOUTS = "gateway-timeouts"
"""The payment gateway times out on every try of the first attempt (the step is retried)."""
AGENT_CRASH = "agent-crash"
"""The shipping agent instance that takes the first attempt crashes holding it."""

SKUS = ("mug", "tee", "poster", "socks", "cap", "tote")
ADDRESSES = (
    "12 High St, Leeds",
    "3 Rue Neuve, Lyon",
    "8 Main St, Dublin",
    "41 Calle Mayor, Madrid",
    "5 Kungsgatan, Uppsala",
)


@dataclass(frozen=True)
class Scenario:
    """Which order meets which trouble, and when the warehouse goes down."""

    orders: int
    seed: int
    declined: int
    """A b2b order whose card is declined: `error` and an operator alert."""
    undeliverable: int
    """A retail order the carrier refuses: the charge and reservation are compensated."""
    crash: int
    """Its shipping request is taken by an agent instance that then crashes."""
    flaky: int
    """Its payment exhausts the agent's retries once: the step fails and is tried again."""
    b2b: frozenset[int]
    """Orders placed as `b2b-order` (failures go to an operator instead of compensation)."""
    outage_at: int
    """The warehouse goes down at this reservation call (of the agent process)."""
    early: int = 0
    """An order without trouble whose payment is confirmed before it is placed: the event is
    stored unmatched and completes the order's wait when it opens."""
    unconfirmed: int = 0
    """An order without trouble placed as `express-order` whose payment is never confirmed:
    its short wait times out and the order is compensated."""
    outage_seconds: float = 2.0

    @classmethod
    def build(cls, orders: int = DEFAULT_ORDERS, seed: int = DEFAULT_SEED) -> Scenario:
        if orders < MIN_ORDERS:
            raise ValueError(f"the demo needs at least {MIN_ORDERS} orders, got {orders}")
        rng = random.Random(seed)  # noqa: S311 - a reproducible simulation, not security
        declined, undeliverable, crash, flaky = rng.sample(range(1, orders + 1), 4)
        b2b = {n for n in range(1, orders + 1) if rng.random() < 0.2} | {declined}
        b2b -= {undeliverable}
        # Its own generator: the troubles above stay where they were before it existed.
        untroubled = sorted(set(range(1, orders + 1)) - {declined, undeliverable, crash, flaky})
        early = random.Random(f"{seed}:early").choice(untroubled)  # noqa: S311 - simulation
        others = [n for n in untroubled if n != early]
        unconfirmed = random.Random(f"{seed}:unconfirmed").choice(others)  # noqa: S311
        return cls(
            orders=orders,
            seed=seed,
            declined=declined,
            undeliverable=undeliverable,
            crash=crash,
            flaky=flaky,
            b2b=frozenset(b2b - {unconfirmed}),
            outage_at=max(2, orders // 3),
            early=early,
            unconfirmed=unconfirmed,
        )

    def workflow(self, number: int) -> str:
        if number == self.unconfirmed:
            return "express-order"
        return "b2b-order" if number in self.b2b else "order"

    def order(self, number: int) -> dict[str, Any]:
        """The input of order `number` (1-based)."""
        rng = random.Random(f"{self.seed}:order:{number}")  # noqa: S311 - simulation
        trouble = {self.crash: AGENT_CRASH, self.flaky: GATEWAY_TIMEOUTS}.get(number)
        return {
            "order": number,
            "sku": rng.choice(SKUS),
            "qty": rng.randint(1, 5),
            "unit_price": rng.choice((4, 9, 12, 25)),
            "card": DECLINED_CARD if number == self.declined else GOOD_CARD,
            "address": UNDELIVERABLE if number == self.undeliverable else rng.choice(ADDRESSES),
            "trouble": trouble,
        }
