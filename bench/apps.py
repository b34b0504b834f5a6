"""The workflows of the throughput benchmarks, loadable by the CLI (SASFLOW_APP=bench.apps).

`one`: a single step whose agent does nothing (W1, W3). `three`: three sequential such steps
(W2). The agent `noop` returns at once, so the figures measure the engine, not the work.
"""

from __future__ import annotations

from sasflow import Registry, Step, Workflow
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

registry = Registry([one, three], [noop])
