"""The example's order workflows and agents, for `SASFLOW_APP=examples.orders.app`.

The demo's scenario and simulated services (`sasflow.demo`), with order lines reserved by a
map step and shipping as a child workflow (workflows.py); each process builds its own
simulated services, so the warehouse outage happens in the inventory agent process.
"""

from __future__ import annotations

from examples.orders.agents import inventory_agent, shipping_agent
from examples.orders.workflows import workflows
from sasflow import Registry
from sasflow.demo.app import payments_agent
from sasflow.demo.scenario import Scenario
from sasflow.demo.services import Happenings, RemoteServices


def registry() -> Registry:
    """Called by `--app examples.orders.app` in each process (the attribute is a factory)."""
    services = RemoteServices(Scenario.build(), Happenings())
    return Registry(
        workflows=workflows(),
        agents=[inventory_agent(services), payments_agent(services), shipping_agent(services)],
    )
