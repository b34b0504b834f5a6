"""The demo's e-commerce app: the order workflows and the inventory, payments, shipping agents.

An order reserves stock, charges the customer, waits for the payment provider's
`payment_confirmed` event (matched on the order's id), cools off for a second (a timer), then
ships. A retail `order` that fails is
compensated (the charge refunded, the stock released); a `b2b-order` that fails goes to
`error` with an operator alert instead, since business customers are handled by a person; an
`express-order` waits only seconds for its confirmation, then is compensated.
Timeouts, backoffs and breaker windows are short so the whole demo takes seconds.

`create_registry` (the default scenario) is what `--app sasflow.demo.app:create_registry`
loads in separate processes; the all-in-one demo calls `build_registry` with its own
scenario and feed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sasflow import (
    Backoff,
    BreakerPolicy,
    Default,
    Registry,
    RetryPolicy,
    Step,
    StepContext,
    StepPolicy,
    Workflow,
)
from sasflow.agents import Agent, Call
from sasflow.demo.provider import EVENT, ChargeHook
from sasflow.demo.scenario import AGENT_CRASH, Scenario
from sasflow.demo.services import Happenings, RemoteServices
from sasflow.states import OnFailure

log = logging.getLogger(__name__)

STEP_POLICY = StepPolicy(
    timeout=2.0, max_failures=3, backoff=Backoff(initial=0.3, multiplier=2.0, maximum=2.0)
)
"""Short deadlines: an expired step is found by the supervisor within a couple of seconds."""
AGENT_RETRY = RetryPolicy(initial=0.02, maximum=0.2, max_attempts=3)
WAREHOUSE_BREAKER = BreakerPolicy(fail_max=3, reset_timeout=1.0)
PAYMENT_WAIT_S = 30.0
"""How long an order waits for its payment confirmation before `on_timeout` applies."""
EXPRESS_WAIT_S = 4.0
"""The same for an `express-order`: its payment must be confirmed within seconds."""
COOL_OFF_S = 1.0
"""The timer between the confirmed payment and the shipment."""

CrashHook = Callable[[], None]
"""Called by a shipping agent instance when it 'crashes'; the demo stops that instance."""


def inventory_agent(services: RemoteServices) -> Agent:
    agent = Agent("inventory", breakers={"warehouse": WAREHOUSE_BREAKER}, retry=AGENT_RETRY)

    @agent.handler("reserve", dependency="warehouse")
    def reserve(call: Call) -> dict[str, Any]:
        return services.reserve(
            call.idempotency_key, call.input["sku"], call.input["qty"], call.remaining()
        )

    @agent.handler("release")
    def release(call: Call) -> dict[str, Any]:
        return services.release(
            call.idempotency_key, call.input["output"]["reservation"], call.remaining()
        )

    return agent


def payments_agent(services: RemoteServices, on_charged: ChargeHook | None = None) -> Agent:
    """The payments agent; `on_charged` (the demo's payment provider) is told of each charge,
    as a real gateway would go on to confirm it (in separate processes nobody is: the partner
    sends the confirmations, examples/orders/confirm_payments.py)."""
    agent = Agent("payments", retry=AGENT_RETRY)

    @agent.handler("charge")
    def charge(call: Call) -> dict[str, Any]:
        charged = services.charge(
            call.idempotency_key,
            call.input["amount"],
            call.input["card"],
            call.input.get("trouble"),
            call.remaining(),
        )
        if on_charged is not None and call.input.get("order_id"):
            on_charged(call.input["order_id"], call.input["amount"])
        return charged

    @agent.handler("refund")
    def refund(call: Call) -> dict[str, Any]:
        charged = call.input["output"]
        return services.refund(
            call.idempotency_key, charged["charge"], charged["amount"], call.remaining()
        )

    return agent


def shipping_agent(services: RemoteServices, on_crash: CrashHook | None = None) -> Agent:
    """The shipping agent; one built per instance so each can report its own crash."""
    agent = Agent("shipping", retry=AGENT_RETRY)

    @agent.handler("ship")
    def ship(call: Call) -> dict[str, Any]:
        if call.input.get("trouble") == AGENT_CRASH and call.attempt == 1:
            services.feed.add(
                "crash",
                f"a shipping agent instance crashed holding step "
                f"{call.step_id} (order of run {call.run_id})",
            )
            if on_crash is not None:
                on_crash()
            # A crashed process replies nothing: hold the step past its deadline, whatever
            # `cancelled` says, so the agent abandons it silently.
            threading.Event().wait(call.remaining() + 0.2)
            return {}
        return services.ship(call.idempotency_key, call.input["address"], call.remaining())

    return agent


def _reserve_input(ctx: StepContext) -> dict[str, Any]:
    return {"sku": ctx.run_input["sku"], "qty": ctx.run_input["qty"]}


def _charge_input(ctx: StepContext) -> dict[str, Any]:
    order = ctx.run_input
    return {
        "amount": order["qty"] * order["unit_price"],
        "card": order["card"],
        "reservation": ctx.outputs["reserve"]["reservation"],
        "trouble": order["trouble"],
        "order_id": order.get("order_id"),
    }


def _ship_input(ctx: StepContext) -> dict[str, Any]:
    return {
        "address": ctx.run_input["address"],
        "sku": ctx.run_input["sku"],
        "qty": ctx.run_input["qty"],
        "trouble": ctx.run_input["trouble"],
    }


def _steps(on_payment_timeout: str | Default, wait_s: float = PAYMENT_WAIT_S) -> list[Step]:
    return [
        Step(
            "reserve",
            "inventory",
            "reserve",
            input=_reserve_input,
            policy=STEP_POLICY,
            compensate="release",
        ),
        Step(
            "charge",
            "payments",
            "charge",
            input=_charge_input,
            policy=STEP_POLICY,
            compensate="refund",
        ),
        Step.wait_for(
            EVENT,
            event=EVENT,
            match="input.order_id",
            timeout=wait_s,
            on_timeout=on_payment_timeout,
        ),
        Step.sleep("cool_off", seconds=COOL_OFF_S),
        Step("ship", "shipping", "ship", input=_ship_input, policy=STEP_POLICY),
    ]


def workflows() -> list[Workflow]:
    return [
        # An unconfirmed retail payment is refunded; a business customer's goes to a person.
        Workflow("order", _steps("compensate"), on_failure="compensate"),
        Workflow("b2b-order", _steps("fail"), on_failure=OnFailure.ERROR),
        # An express order's payment not confirmed within seconds is refunded (the demo's
        # provider never confirms the one of `Scenario.unconfirmed`).
        Workflow("express-order", _steps("compensate", EXPRESS_WAIT_S), on_failure="compensate"),
    ]


def build_registry(
    services: RemoteServices,
    on_crash: CrashHook | None = None,
    on_charged: ChargeHook | None = None,
) -> Registry:
    return Registry(
        workflows=workflows(),
        agents=[
            inventory_agent(services),
            payments_agent(services, on_charged),
            shipping_agent(services, on_crash),
        ],
    )


def create_registry() -> Registry:
    """The registry of the default scenario (for `--app sasflow.demo.app:create_registry`)."""
    return build_registry(RemoteServices(Scenario.build(), Happenings()))
