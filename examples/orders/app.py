"""The demo's order workflows and agents, for `SASFLOW_APP=examples.orders.app`.

The definitions are the ones `sasflow demo` runs (`sasflow.demo.app`); each process builds its
own simulated services, so the warehouse outage happens in the inventory agent process.
"""

from __future__ import annotations

from sasflow import Registry
from sasflow.demo.app import create_registry


def registry() -> Registry:
    """Called by `--app examples.orders.app` in each process (the attribute is a factory)."""
    return create_registry()
