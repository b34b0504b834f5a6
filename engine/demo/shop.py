"""The demo's shop front and payment provider as separate processes: place the scenario's
orders on `<ns>.submit` of a real broker, confirm their payments on `<ns>.events`
(examples/orders drives them)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from sasflow.demo.provider import confirmation, publish_confirmations
from sasflow.demo.run import OrderInput, demo_order_input, order_id, place_orders
from sasflow.demo.scenario import Scenario
from sasflow.errors import PublishError
from sasflow.settings import Settings
from sasflow.transport.base import Transport
from sasflow.transport.factory import broker_options, make_transport
from sasflow.transport.topology import Names


def place_scenario_orders(
    settings: Settings, orders: int, seed: int, order_input: OrderInput = demo_order_input
) -> str:
    """Publish `orders` orders of the scenario seeded `seed`, each with `order_input`'s input;
    returns their key prefix."""

    def transports(role: str) -> Transport:
        # RabbitMQ (amqp://, amqps://): the in-process bus cannot reach other processes.
        return make_transport(
            settings.broker_url, process_name=f"orders-{role}", options=broker_options(settings)
        )

    prefix = f"shop-{uuid.uuid4().hex[:8]}-"
    place_orders(
        transports, Names(settings.namespace), Scenario.build(orders, seed), prefix, order_input
    )
    return prefix


def demo_amount(order: dict[str, Any]) -> int:
    """What a demo order costs: its quantity at its unit price."""
    return int(order["qty"]) * int(order["unit_price"])


def confirm_scenario_payments(
    settings: Settings,
    key_prefix: str,
    orders: int,
    seed: int,
    *,
    order_input: OrderInput = demo_order_input,
    amount: Callable[[dict[str, Any]], int] = demo_amount,
) -> int:
    """Publish, as the payment provider would, the `payment_confirmed` event of every order
    placed with `key_prefix` (its input by `order_input`, its `amount` charged) but the
    declined one and the unconfirmed express order (its wait times out); returns how many were
    sent."""
    scenario = Scenario.build(orders, seed)
    bodies = []
    for number in range(1, orders + 1):
        if number in (scenario.declined, scenario.unconfirmed):
            continue  # a declined card is never confirmed; the express order's is withheld
        order = order_input(scenario, number, key_prefix)
        bodies.append(confirmation(order_id(key_prefix, number), amount(order)))
    transport = make_transport(
        settings.broker_url, process_name="orders-payments", options=broker_options(settings)
    )
    transport.connect()
    try:
        refused = publish_confirmations(transport, Names(settings.namespace), bodies)
    finally:
        transport.close()
    if refused:
        raise PublishError(f"{refused} payment confirmations refused by the broker")
    return len(bodies)
