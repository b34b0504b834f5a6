"""The README's example app: reserve stock, then charge the customer.

Run it with `SASFLOW_APP=examples.quickstart` (from the repository root).
"""

from __future__ import annotations

from typing import Any

from sasflow import BreakerPolicy, Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError

inventory = Agent("inventory", breakers={"warehouse": BreakerPolicy(fail_max=5, reset_timeout=30)})
payments = Agent("payments")


@inventory.handler("reserve", dependency="warehouse")
def reserve(call: Call) -> dict[str, Any]:
    # call.input, call.idempotency_key (stable across attempts), call.remaining() seconds left
    if call.input["qty"] > 100:
        raise PermanentError("quantity too large")  # -> step error, no retries
    return {"reservation": f"R-{call.idempotency_key[:8]}", "qty": call.input["qty"]}


@payments.handler("charge")
def charge(call: Call) -> dict[str, Any]:
    # Retried with backoff inside the deadline: ConnectionError, TimeoutError, and httpx's,
    # requests' and urllib3's refused connections, timeouts, 5xx and 429 (docs/agents.md).
    return {"charged": call.input["amount"], "reservation": call.input["reservation"]}


def _charge_input(ctx: StepContext) -> dict[str, Any]:
    reserved = ctx.outputs["reserve"]
    return {"amount": 5 * reserved["qty"], "reservation": reserved["reservation"]}


order = Workflow(
    "order",
    [
        Step("reserve", "inventory", "reserve", policy=StepPolicy(timeout=10, max_failures=5)),
        Step("charge", "payments", "charge", input=_charge_input),
    ],
    version=1,
)

registry = Registry(workflows=[order], agents=[inventory, payments])
