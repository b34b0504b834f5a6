"""An app with the long names of a real one, for the CLI's layout tests: a checkout whose
payment step is refused with a long permanent error."""

from __future__ import annotations

from typing import Any

from sasflow import Backoff, Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError

payments = Agent("payments_gateway")

DECLINED = (
    "card declined by the issuing bank: insufficient funds for order A-471 "
    "(authorisation code 05, do not honour)"
)


@payments.handler("reserve_inventory")
def reserve(call: Call) -> dict[str, Any]:
    return {"reserved": call.input.get("sku")}


@payments.handler("process_payment")
def pay(call: Call) -> dict[str, Any]:
    raise PermanentError(DECLINED)


QUICK = StepPolicy(timeout=10, max_failures=1, backoff=Backoff(initial=0.2, maximum=1))

checkout = Workflow(
    "checkout_with_payment",
    [
        Step("reserve_inventory", "payments_gateway", "reserve_inventory", policy=QUICK),
        Step(
            "process_payment",
            "payments_gateway",
            "process_payment",
            after=("reserve_inventory",),
            policy=QUICK,
        ),
    ],
)

registry = Registry([checkout], [payments])
