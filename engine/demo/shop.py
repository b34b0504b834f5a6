"""The demo's shop front and payment provider as separate processes: place the scenario's
orders on `<ns>.submit` of a real broker, confirm their payments on `<ns>.events`
(examples/orders drives them)."""

from __future__ import annotations

import uuid

from sasflow.demo.provider import confirmation, publish_confirmations
from sasflow.demo.run import order_id, place_orders
from sasflow.demo.scenario import Scenario
from sasflow.errors import PublishError
from sasflow.settings import Settings
from sasflow.transport.base import Transport
from sasflow.transport.factory import broker_options, make_transport
from sasflow.transport.topology import Names


def place_scenario_orders(settings: Settings, orders: int, seed: int) -> str:
    """Publish `orders` orders of the scenario seeded `seed`; returns their key prefix."""

    def transports(role: str) -> Transport:
        # RabbitMQ (amqp://, amqps://): the in-process bus cannot reach other processes.
        return make_transport(
            settings.broker_url, process_name=f"orders-{role}", options=broker_options(settings)
        )

    prefix = f"shop-{uuid.uuid4().hex[:8]}-"
    place_orders(transports, Names(settings.namespace), Scenario.build(orders, seed), prefix)
    return prefix


def confirm_scenario_payments(settings: Settings, key_prefix: str, orders: int, seed: int) -> int:
    """Publish, as the payment provider would, the `payment_confirmed` event of every order
    placed with `key_prefix` but the declined one and the unconfirmed express order (its wait
    times out); returns how many were sent."""
    scenario = Scenario.build(orders, seed)
    bodies = []
    for number in range(1, orders + 1):
        if number in (scenario.declined, scenario.unconfirmed):
            continue  # a declined card is never confirmed; the express order's is withheld
        order = scenario.order(number)
        bodies.append(
            confirmation(order_id(key_prefix, number), order["qty"] * order["unit_price"])
        )
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
