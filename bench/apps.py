"""The workflows of the throughput benchmarks, loadable by the CLI (SASFLOW_APP=bench.apps).

`one`: a single step whose agent does nothing (W1, W3). `three`: three sequential such steps
(W2). `tick`: what each schedule submits in bench/schedules.py. The agent `noop` returns at
once, so the figures measure the engine, not the work.
"""

from __future__ import annotations

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call

noop = Agent("noop")


@noop.handler("nothing")
def nothing(_call: Call) -> None:
    return None


one = Workflow("one", [Step("only", "noop", "nothing")])
three = Workflow(
    "three",
    [Step("a", "noop", "nothing"), Step("b", "noop", "nothing"), Step("c", "noop", "nothing")],
)

# bench/schedules.py: each tick's run; the request expires after a second (no agent serves it
# there: the benchmark measures the schedules, and the broker never holds many requests).
tick = Workflow("tick", [Step("only", "noop", "nothing", policy=StepPolicy(timeout=1))])

registry = Registry([one, three, tick], [noop])
