"""An app for the conditions tests (docs/concepts.md "Conditions"): agent `shop`; workflow
`refunds`: charge, then refund only when the charge was captured, a receipt of the refund
(only after it), an audit after both (a fan-in), and a closing step after the receipt that runs
even when the receipt was skipped (`if_skipped="run"`)."""

from __future__ import annotations

from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call
from sasflow.when import Cond

shop = Agent("shop")


@shop.handler("charge")
def charge(call: Call) -> dict[str, Any]:
    return {"captured": bool(call.input["capture"]), "amount": call.input["amount"]}


@shop.handler("echo")
def echo(call: Call) -> dict[str, Any]:
    return {"step": call.step}


FAST = StepPolicy(timeout=10)

refunds = Workflow(
    "refunds",
    [
        Step("charge", "shop", "charge", policy=FAST),
        Step(
            "refund",
            "shop",
            "echo",
            policy=FAST,
            when=Cond("steps.charge.captured", "==", True),
        ),
        Step("receipt", "shop", "echo", policy=FAST),
        Step("audit", "shop", "echo", after=("charge", "refund"), policy=FAST),
        Step("close", "shop", "echo", after=("receipt",), if_skipped="run", policy=FAST),
    ],
)

registry = Registry([refunds], [shop])
