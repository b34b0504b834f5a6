"""An app for operator and recovery tests: a fake remote service that records every call.

Set SASFLOW_TEST_REMOTE_LOG to a file path to have each call appended to it as a JSON line
(idempotency key, attempt, step, pid), like a remote service's request log.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from sasflow import Backoff, Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call, PermanentError

remote = Agent("remote")


def _record(call: Call) -> None:
    path = os.environ.get("SASFLOW_TEST_REMOTE_LOG")
    if path:
        line = json.dumps(
            {
                "key": call.idempotency_key,
                "attempt": call.attempt,
                "step": call.step,
                "action": call.action,
                "pid": os.getpid(),
            }
        )
        with open(path, "a", encoding="utf-8") as log:  # noqa: PTH123 - one line per call
            log.write(line + "\n")


@remote.handler("call")
def call_remote(call: Call) -> dict[str, Any]:
    _record(call)
    time.sleep(float(call.input.get("delay", 0)))
    if call.input.get("fail"):
        raise PermanentError(f"remote refused {call.step}")
    return {"step": call.step, "seen": call.input.get("value"), "key": call.idempotency_key}


@remote.handler("beat")
def beat(call: Call) -> dict[str, Any]:
    """Works for `delay` seconds, heartbeating all along."""
    _record(call)
    until = time.monotonic() + float(call.input.get("delay", 0))
    while time.monotonic() < until and not call.cancelled.is_set():
        call.heartbeat()
        time.sleep(0.05)
    return {"step": call.step, "key": call.idempotency_key}


@remote.handler("undo")
def undo(call: Call) -> dict[str, Any]:
    _record(call)
    return {"undone": call.step}


def _after(previous: str) -> Any:
    def build(ctx: StepContext) -> Any:
        return {**ctx.run_input, "value": ctx.outputs[previous]["seen"]}

    return build


QUICK = StepPolicy(timeout=10, max_failures=3, backoff=Backoff(initial=0.2, maximum=1))

ops = Workflow(
    "ops",
    [
        Step(
            "a",
            "remote",
            "call",
            policy=QUICK,
            input=lambda ctx: {
                "value": ctx.run_input.get("value"),
                "delay": ctx.run_input.get("delay", 0),
            },
        ),
        Step("b", "remote", "call", policy=QUICK, input=_after("a")),
    ],
)

killable = Workflow(
    "killable",
    [
        Step(
            "only",
            "remote",
            "call",
            # A short wait clock: the request a killed agent held expires soon after.
            policy=StepPolicy(
                timeout=3, wait_timeout=2, max_failures=3, backoff=Backoff(initial=0.2, maximum=1)
            ),
        ),
    ],
)

heartbeating = Workflow(
    "heartbeating",
    [
        Step(
            "only",
            "remote",
            "beat",
            # A long timeout, a short heartbeat clock: a dead agent is found in seconds.
            policy=StepPolicy(
                timeout=60,
                heartbeat_timeout=1,
                wait_timeout=5,
                max_failures=3,
                backoff=Backoff(initial=0.2, maximum=1),
            ),
        ),
    ],
)

signed = Workflow(
    "signed",
    [
        Step("a", "remote", "call", policy=StepPolicy(timeout=10)),
        Step.approval("sign", approvers="refunds", form={"amount": int}, timeout=3600),
        Step("b", "remote", "call", policy=StepPolicy(timeout=10)),
    ],
)
"""A run that waits, after `a`, for an approval of the `refunds` group with an amount."""

registry = Registry([ops, killable, heartbeating, signed], [remote])
