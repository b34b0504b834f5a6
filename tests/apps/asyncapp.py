"""A small app for tests: an agent of `async def` handlers, one that defers once, and one
that fails with a traceback, run by `sasflow agent` processes."""

from __future__ import annotations

import asyncio
from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call, Defer, PermanentError

quotes = Agent("quotes")


@quotes.handler("price")
async def price(call: Call) -> dict[str, Any]:
    await asyncio.sleep(0.01)
    if call.input.get("defer") and call.attempt == 1:
        raise Defer(0.2, reason="the price list is being refreshed")
    if call.input.get("fail"):
        raise PermanentError(f"no price for {call.input['sku']}")
    return {"sku": call.input["sku"], "price": 42}


quote = Workflow(
    "quote",
    [Step("price", "quotes", "price", policy=StepPolicy(timeout=10))],
)

registry = Registry(workflows=[quote], agents=[quotes])
