"""An app for the event-wait tests: `order` waits, after its first step, for a
`payment_confirmed` event matching its input's `order_id`, then ships."""

from __future__ import annotations

from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call

shop = Agent("shop")


@shop.handler("reserve")
def reserve(call: Call) -> dict[str, Any]:
    return {"reserved": call.input.get("order_id")}


@shop.handler("ship")
def ship(call: Call) -> dict[str, Any]:
    return {"shipped": call.input.get("order_id")}


POLICY = StepPolicy(timeout=60)

order = Workflow(
    "order",
    [
        Step("reserve", "shop", "reserve", policy=POLICY),
        Step.wait_for("paid", event="payment_confirmed", match="input.order_id", timeout=3600),
        Step("ship", "shop", "ship", policy=POLICY),
    ],
)

registry = Registry([order], [shop])
