"""An app whose workflow `order` has three versions, for `sasflow runs migrate`: version 2
renames `charge` to `pay`, adds `ship` after it and drops `email`; version 3 keeps only
`reserve`. `charge` waits for `gate` (so a test can hold it in flight)."""

from __future__ import annotations

import threading
from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call

shop = Agent("shop")
gate = threading.Event()
"""Set by a test to let `charge` answer."""

POLICY = StepPolicy(timeout=30)


@shop.handler("reserve")
def reserve(call: Call) -> dict[str, Any]:
    return {"reserved": call.input.get("item")}


@shop.handler("charge")
def charge(call: Call) -> dict[str, Any]:
    if not gate.wait(30):
        raise TimeoutError("the test never opened the gate")
    return {"charged": call.input.get("reserved"), "key": call.idempotency_key}


@shop.handler("ship")
def ship(call: Call) -> dict[str, Any]:
    return {"shipped": call.input.get("charged")}


@shop.handler("email")
def email(call: Call) -> dict[str, Any]:
    return {"emailed": True}


def _after(step: str) -> Any:
    return lambda ctx: ctx.outputs[step]


v1 = Workflow(
    "order",
    [
        Step("reserve", "shop", "reserve", policy=POLICY),
        Step(
            "charge", "shop", "charge", after=("reserve",), input=_after("reserve"), policy=POLICY
        ),
        Step("email", "shop", "email", after=("charge",), input=_after("charge"), policy=POLICY),
    ],
    version=1,
)
v2 = Workflow(
    "order",
    [
        Step("reserve", "shop", "reserve", policy=POLICY),
        Step("pay", "shop", "charge", after=("reserve",), input=_after("reserve"), policy=POLICY),
        Step("ship", "shop", "ship", after=("pay",), input=_after("pay"), policy=POLICY),
    ],
    version=2,
)
v3 = Workflow("order", [Step("reserve", "shop", "reserve", policy=POLICY)], version=3)

registry = Registry([v1, v2, v3], [shop])
