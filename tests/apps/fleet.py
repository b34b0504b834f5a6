"""Agents of mixed versions and wedged agents (docs/agents.md): one agent name, several
builds of it, as processes of a rolling deploy or a wedged process would run them."""

from __future__ import annotations

import threading
from typing import Any

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call

old = Agent("mixed")
"""The build before the action `fresh` existed."""
new = Agent("mixed")
"""The build with it."""


@old.handler("plain")
@new.handler("plain")
def plain(call: Call) -> dict[str, Any]:
    return {"plain": call.input}


@new.handler("fresh")
def fresh(call: Call) -> dict[str, Any]:
    return {"fresh": call.input}


release = threading.Event()
"""Set to let the hung handlers return (a test's teardown does it)."""

stuck = Agent("stuck")
"""Its `hang` ignores `call.cancelled` and holds its thread until `release`."""
healthy = Agent("stuck")
"""The same agent in a healthy process: `hang` returns at once."""


@stuck.handler("hang")
def hang(call: Call) -> dict[str, Any]:
    release.wait(120)
    return {"hung": True}


@healthy.handler("hang")
def hang_not(call: Call) -> dict[str, Any]:
    return {"hung": False}


@stuck.handler("quick")
@healthy.handler("quick")
def quick(call: Call) -> dict[str, Any]:
    return {"quick": call.input}


SHORT = StepPolicy(timeout=1, max_failures=1)
BRIEF = StepPolicy(timeout=0.5, wait_timeout=0.5, max_failures=1)
"""A step whose whole envelope (wait and execution) is 1 s."""

registry = Registry(
    [
        Workflow("fresh", [Step("only", "mixed", "fresh", policy=StepPolicy(timeout=10))]),
        Workflow("hang", [Step("only", "stuck", "hang", policy=SHORT)]),
        Workflow("quick", [Step("only", "stuck", "quick", policy=StepPolicy(timeout=5))]),
        Workflow("brief", [Step("only", "stuck", "quick", policy=BRIEF)]),
    ],
    [new, stuck],
)
