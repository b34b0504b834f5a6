"""An app for the parking tests (docs/operations.md "Parked steps"): agent `partner`, whose
`call` action fails or succeeds as the test's `Switch` says; workflows whose steps park when
their failures run out (and on a permanent error unless told otherwise)."""

from __future__ import annotations

import threading
from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call
from sasflow.policy import Backoff, RetryPolicy


class Switch:
    """Whether the partner is broken (its calls raise a transient error)."""

    def __init__(self) -> None:
        self.broken = threading.Event()
        self.broken.set()


switch = Switch()
partner = Agent("partner", retry=RetryPolicy(initial=0.01, maximum=0.01, max_attempts=1))


@partner.handler("call")
def call(call: Call) -> dict[str, Any]:
    if switch.broken.is_set():
        raise ConnectionError("partner down")
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

registry = Registry([parks, parks_compensates, errors_fail, step_parks, fails], [partner])
