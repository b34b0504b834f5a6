"""The example's inventory and shipping agents (the payments agent is the demo's).

Stock is reserved once per order line (a map item: `call.map_index` is the line) and released
the same way when the order is compensated; shipping packs, wraps gifts, labels (the carrier:
it refuses the scenario's undeliverable address) and dispatches. The shipping agent instance
that takes the first attempt of the `agent-crash` order's dispatch never replies, so the step
expires and the supervisor hands it to another attempt.
"""

from __future__ import annotations

import threading
from typing import Any

from sasflow.agents import Agent, Call, PermanentError
from sasflow.demo.app import AGENT_RETRY, WAREHOUSE_BREAKER
from sasflow.demo.scenario import AGENT_CRASH
from sasflow.demo.services import RemoteServices


def inventory_agent(services: RemoteServices) -> Agent:
    agent = Agent("inventory", breakers={"warehouse": WAREHOUSE_BREAKER}, retry=AGENT_RETRY)

    @agent.handler("check")
    def check(call: Call) -> dict[str, Any]:
        lines = call.input.get("lines")
        if not isinstance(lines, list) or not lines:
            raise PermanentError("an order needs at least one line")
        for index, line in enumerate(lines):
            qty = line.get("qty") if isinstance(line, dict) else None
            if not isinstance(qty, int) or isinstance(qty, bool) or qty < 1:
                raise PermanentError(f"line {index}: qty must be a positive integer")
        return {"lines": len(lines), "units": sum(line["qty"] for line in lines)}

    @agent.handler("reserve", dependency="warehouse")
    def reserve(call: Call) -> dict[str, Any]:
        line = call.input
        reserved = services.reserve(
            call.idempotency_key, line["sku"], line["qty"], call.remaining()
        )
        return {**reserved, "line": call.map_index}

    @agent.handler("release")
    def release(call: Call) -> dict[str, Any]:
        reserved = call.input["output"]
        released = services.release(call.idempotency_key, reserved["reservation"], call.remaining())
        return {**released, "line": reserved["line"]}

    return agent


def shipping_agent(services: RemoteServices) -> Agent:
    agent = Agent("shipping", retry=AGENT_RETRY)

    @agent.handler("pack")
    def pack(call: Call) -> dict[str, Any]:
        return {"parcel": f"P-{call.idempotency_key[:8]}", "lines": len(call.input["lines"])}

    @agent.handler("unpack")
    def unpack(call: Call) -> dict[str, Any]:
        return {"unpacked": call.input["output"]["parcel"]}

    @agent.handler("gift_wrap")
    def gift_wrap(call: Call) -> dict[str, Any]:
        return {"wrapped": call.input["parcel"]}

    @agent.handler("label")
    def label(call: Call) -> dict[str, Any]:
        # The carrier: refuses the undeliverable address (a permanent error).
        return services.ship(call.idempotency_key, call.input["address"], call.remaining())

    @agent.handler("void_label")
    def void_label(call: Call) -> dict[str, Any]:
        return {"voided": call.input["output"]["tracking"]}

    @agent.handler("dispatch")
    def dispatch(call: Call) -> dict[str, Any]:
        if call.input.get("trouble") == AGENT_CRASH and call.attempt == 1:
            # A crashed process replies nothing: hold the step past its deadline, whatever
            # `cancelled` says, so the agent abandons it silently.
            threading.Event().wait(call.remaining() + 0.2)
            return {}
        return {"dispatched": call.input["tracking"]}

    return agent
