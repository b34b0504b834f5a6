"""An app for the parking tests (docs/operations.md "Parked steps"): agent `partner` (the
store-level tests answer for it); workflows whose steps park when their failures run out (and
on a permanent error unless told otherwise), and one that does not park."""

from __future__ import annotations

from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call
from sasflow.policy import Backoff

partner = Agent("partner")


@partner.handler("call")
def call(call: Call) -> dict[str, Any]:
    return {"called": call.input.get("order")}


@partner.handler("undo")
def undo(call: Call) -> dict[str, Any]:
    return {"undone": call.input}


QUICK = StepPolicy(timeout=5, max_failures=2, backoff=Backoff(initial=0.05, maximum=0.05))

parks = Workflow("parks", [Step("call", "partner", "call", policy=QUICK)], on_exhausted="park")
parks_compensates = Workflow(
    "parks_compensates",
    [
        Step("first", "partner", "undo", policy=QUICK, compensate="undo"),
        Step("call", "partner", "call", policy=QUICK),
    ],
    on_exhausted="park",
    on_failure="compensate",
)
errors_fail = Workflow(
    "errors_fail",
    [Step("call", "partner", "call", policy=QUICK)],
    on_exhausted="park",
    on_error="fail",
)
step_parks = Workflow(
    "step_parks",
    [Step("call", "partner", "call", policy=StepPolicy(max_failures=2, on_exhausted="park"))],
)
fails = Workflow("fails", [Step("call", "partner", "call", policy=QUICK)])
siblings = Workflow(
    "siblings",
    [
        Step("call", "partner", "call", policy=QUICK, after=()),
        Step("other", "partner", "call", policy=QUICK, after=()),
    ],
    on_exhausted="park",
    on_error="fail",
)

registry = Registry([parks, parks_compensates, errors_fail, step_parks, fails, siblings], [partner])
