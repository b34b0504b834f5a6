"""The example's orders: the demo's scenario with order lines, placed and confirmed on a broker.

An order of the demo's scenario (`sasflow.demo.scenario`) buys one sku; here it buys one to
three (`lines: [{"sku", "qty"}, ...]`, the first the demo's sku and quantity), every fourth
order is a gift (`gift: true`, wrapped by the shipping workflow), and the order the carrier
refuses always has three lines (so its compensation releases three reservations). The amount
charged and confirmed is the units of every line times the order's `unit_price`. The demo's
shop front and payment provider (`sasflow.demo.shop`) publish them.
"""

from __future__ import annotations

import random
from typing import Any

from sasflow import Settings
from sasflow.demo.run import order_id
from sasflow.demo.scenario import SKUS, Scenario
from sasflow.demo.shop import confirm_scenario_payments, place_scenario_orders

MAX_LINES = 3
GIFT_EVERY = 4


def order_input(scenario: Scenario, number: int, key_prefix: str) -> dict[str, Any]:
    """The input of order `number` (1-based) placed with `key_prefix`."""
    order = scenario.order(number)
    rng = random.Random(f"{scenario.seed}:lines:{number}")  # noqa: S311 - simulation
    count = MAX_LINES if number == scenario.undeliverable else rng.randint(1, MAX_LINES)
    others = rng.sample([s for s in SKUS if s != order["sku"]], count - 1)
    lines = [{"sku": order.pop("sku"), "qty": order.pop("qty")}]
    lines += [{"sku": sku, "qty": rng.randint(1, 3)} for sku in others]
    return {
        **order,
        "lines": lines,
        "gift": number % GIFT_EVERY == 0,
        "order_id": order_id(key_prefix, number),
    }


def amount(order: dict[str, Any]) -> int:
    """What the order costs: every line's units at the order's unit price."""
    return sum(int(line["qty"]) for line in order["lines"]) * int(order["unit_price"])


def place_orders(settings: Settings, orders: int, seed: int) -> str:
    """Publish the `orders` orders of the scenario seeded `seed` to `<ns>.submit`, as a shop
    front would (each order's id is its business key); returns their key prefix."""
    return place_scenario_orders(settings, orders, seed, order_input)


def confirm_payments(settings: Settings, key_prefix: str, orders: int, seed: int) -> int:
    """Publish, as the payment provider would, the `payment_confirmed` event of every order
    placed with `key_prefix` but the declined one and the unconfirmed express order (its wait
    times out); returns how many were sent."""
    return confirm_scenario_payments(
        settings, key_prefix, orders, seed, order_input=order_input, amount=amount
    )
