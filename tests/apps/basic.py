"""A small app for tests: a two-step pipeline and a fan-out/fan-in, on an in-process agent."""

from __future__ import annotations

import time
from typing import Any

from sasflow import Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call

echo = Agent("echo")


@echo.handler("upper")
def upper(call: Call) -> dict[str, Any]:
    return {"text": str(call.input["text"]).upper()}


@echo.handler("length")
def length(call: Call) -> dict[str, Any]:
    return {"length": len(call.input["text"])}


@echo.handler("join")
def join(call: Call) -> dict[str, Any]:
    return {"joined": "-".join(str(v) for v in call.input)}


def _from_a(ctx: StepContext) -> Any:
    return ctx.outputs["a"]


def _joined(ctx: StepContext) -> Any:
    return [ctx.outputs["left"]["text"], ctx.outputs["right"]["length"]]


FAST = StepPolicy(timeout=10)

pipeline = Workflow(
    "pipeline",
    [
        Step("a", "echo", "upper", policy=FAST),
        Step("b", "echo", "length", input=_from_a, policy=FAST),
    ],
)

diamond = Workflow(
    "diamond",
    [
        Step("start", "echo", "upper", policy=FAST),
        Step(
            "left",
            "echo",
            "upper",
            after=("start",),
            input=lambda c: c.outputs["start"],
            policy=FAST,
        ),
        Step(
            "right",
            "echo",
            "length",
            after=("start",),
            input=lambda c: c.outputs["start"],
            policy=FAST,
        ),
        Step("end", "echo", "join", after=("left", "right"), input=_joined, policy=FAST),
    ],
)


@echo.handler("nap")
def nap(call: Call) -> dict[str, Any]:
    """Sleep for input["delay"] seconds (simulates a slow remote call)."""
    time.sleep(float(call.input.get("delay", 0)))
    return {"delay": call.input.get("delay", 0), "key": call.idempotency_key}


sleepy = Workflow(
    "sleepy",
    [
        Step("nap1", "echo", "nap", policy=StepPolicy(timeout=30)),
        Step(
            "nap2",
            "echo",
            "nap",
            input=lambda c: {"delay": c.run_input.get("delay", 0)},
            policy=StepPolicy(timeout=30),
        ),
    ],
)

registry = Registry([pipeline, diamond, sleepy], [echo])
