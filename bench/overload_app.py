"""The workflow of the overload benchmark (bench/workloads/overload.py), loadable by the CLI
(SASFLOW_APP=bench.overload_app).

`overload`: one step of agent `paced`, whose handler takes 0.1 s (a remote call), with a step
timeout of 5 s and the default policy otherwise. One agent process with `--concurrency 1`
serves about 10 steps a second.
"""

from __future__ import annotations

import time

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call

WORK_S = 0.1
"""Seconds one call of the handler takes."""
STEP_TIMEOUT_S = 5.0

paced = Agent("paced")


@paced.handler("work")
def work(_call: Call) -> None:
    time.sleep(WORK_S)


overload = Workflow(
    "overload", [Step("only", "paced", "work", policy=StepPolicy(timeout=STEP_TIMEOUT_S))]
)

registry = Registry([overload], [paced])
