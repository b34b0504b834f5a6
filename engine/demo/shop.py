"""The demo's shop front as a separate process: place the scenario's orders on `<ns>.submit`
of a real broker (examples/orders drives it)."""

from __future__ import annotations

import uuid

from sasflow.demo.run import place_orders
from sasflow.demo.scenario import Scenario
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
