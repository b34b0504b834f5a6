"""An app for the flow-control tests: agent `pay` (charge through the `gateway` breaker, refund
with none) and agent `other`; each workflow is one step whose run input names an account."""

from __future__ import annotations

from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call
from sasflow.policy import BreakerPolicy

pay = Agent("pay", breakers={"gateway": BreakerPolicy(fail_max=1, reset_timeout=30)})
other = Agent("other")


@pay.handler("charge", dependency="gateway")
def charge(call: Call) -> dict[str, Any]:
    return {"charged": call.input.get("account")}


@pay.handler("refund")
def refund(call: Call) -> dict[str, Any]:
    return {"refunded": call.input.get("account")}


@other.handler("go")
def go(_call: Call) -> None:
    return None


POLICY = StepPolicy(timeout=60)


charge_flow = Workflow("charge", [Step("only", "pay", "charge", policy=POLICY)])
refund_flow = Workflow("refund", [Step("only", "pay", "refund", policy=POLICY)])
other_flow = Workflow("other", [Step("only", "other", "go", policy=POLICY)])

registry = Registry([charge_flow, refund_flow, other_flow], [pay, other])
