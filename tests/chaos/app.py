"""The chaos app: a three-step workflow on two agents, each step calling the fake remote
service (`SASFLOW_CHAOS_REMOTE_URL`) with its idempotency key; a one-step workflow whose
step works longer than the broker's consumer timeout (the `long_steps` fault); and a workflow
that sleeps (a timer) and waits for an event (tests/chaos/waits.py). `charge` is the
action the chaos run limits to one at a time per account (the run's `input.account`): it calls
the service through a session (tests/chaos/session_call.py).

Every step's output carries the attempt that produced it and the service's effect id, so the
checker can tell which attempt's reply the scheduler accepted.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from sasflow import Backoff, Default, Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call, TransientError
from tests.chaos.session_call import charge_in_session

alpha = Agent("alpha")
beta = Agent("beta")

# Short timeouts so expiries are recovered within the suite's time; a high failure threshold
# because a step may legitimately lose several attempts to the faults.
POLICY = StepPolicy(timeout=4, max_failures=25, backoff=Backoff(initial=0.2, maximum=2))


def call_remote(call: Call) -> dict[str, Any]:
    """POST the call to the remote service; any transport failure is transient."""
    url = os.environ.get("SASFLOW_CHAOS_REMOTE_URL")
    if not url:
        raise TransientError("SASFLOW_CHAOS_REMOTE_URL is not set")
    time.sleep(float((call.input or {}).get("work", 0)))
    body = json.dumps(
        {
            "key": call.idempotency_key,
            "step_id": call.step_id,
            "run_id": call.run_id,
            "step": call.step,
            "attempt": call.attempt,
            "pid": os.getpid(),
        }
    ).encode()
    request = urllib.request.Request(  # noqa: S310 - loopback
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(  # noqa: S310
            request,
            timeout=max(0.1, min(3.0, call.remaining())),
        ) as response:
            effect = json.loads(response.read())
    except (OSError, ValueError) as exc:
        raise TransientError(f"remote service unreachable: {exc}") from exc
    return {
        "effect": effect["effect"],
        "attempt": call.attempt,
        "key": call.idempotency_key,
        "step": call.step,
    }


@alpha.handler("reserve")
def reserve(call: Call) -> dict[str, Any]:
    return call_remote(call)


@beta.handler("charge")
def charge(call: Call) -> dict[str, Any]:
    """Limited to one at a time per account: observed through sessions at the service."""
    return charge_in_session(call)


@alpha.handler("ship")
def ship(call: Call) -> dict[str, Any]:
    return call_remote(call)


def _after(previous: str) -> Any:
    def build(ctx: StepContext) -> Any:
        return {"work": ctx.run_input.get("work", 0), "previous": ctx.outputs[previous]["effect"]}

    return build


def _charge_input(ctx: StepContext) -> Any:
    return {**_after("reserve")(ctx), "account": ctx.run_input.get("account", "")}


RESERVE = Step(
    "reserve",
    "alpha",
    "reserve",
    policy=POLICY,
    input=lambda ctx: {"work": ctx.run_input.get("work", 0)},
)
"""The first step of `chaos_order` and of `chaos_wait`."""

order = Workflow(
    "chaos_order",
    [
        RESERVE,
        Step("charge", "beta", "charge", policy=POLICY, input=_charge_input),
        Step("ship", "alpha", "ship", policy=POLICY, input=_after("charge")),
    ],
)

CONSUMER_TIMEOUT = 10.0
"""Seconds the chaos runs' broker lets a delivery go unacknowledged (its `consumer_timeout`,
30 minutes by default). Above twice POLICY's timeout: the requests of the short steps are
acknowledged after their reply, as before."""
LONG_WORK = 1.5 * CONSUMER_TIMEOUT
"""Seconds the long step works: past the consumer timeout."""
LONG_POLICY = StepPolicy(
    timeout=2.5 * CONSUMER_TIMEOUT,  # at least half the consumer timeout: acked at its start
    heartbeat_timeout=5,
    max_failures=25,
    backoff=Backoff(initial=0.2, maximum=2),
)


@alpha.handler("long_work")
def long_work(call: Call) -> dict[str, Any]:
    """Work `hold` seconds, heartbeating, then call the remote service (once: no `work`)."""
    until = time.monotonic() + float((call.input or {}).get("hold", 0))
    while (left := until - time.monotonic()) > 0:
        call.heartbeat()
        if call.cancelled.wait(min(1.0, left)):
            raise TransientError("the agent gave the attempt up (stopping, or past its deadline)")
    return call_remote(call)


long_run = Workflow(
    "chaos_long",
    [
        Step(
            "long",
            "alpha",
            "long_work",
            policy=LONG_POLICY,
            input=lambda ctx: {"hold": ctx.run_input.get("hold", LONG_WORK)},
        )
    ],
)

WAIT_EVENT = "chaos_paid"
"""The event `chaos_wait` runs wait for, matched on the run's `input.order` (its key)."""
TIMER_S = 1.0
"""The timer of `chaos_wait`: seconds from the moment it became ready (database clock)."""
WAIT_TIMEOUT_S = 8.0
"""How long a `chaos_wait` run waits for its event: short, so the waits whose event is never
sent end within the heal."""
TIMED_OUT = {"timed_out": True}
"""The output of a wait that timed out (`on_timeout=Default(TIMED_OUT)`): the run completes."""

wait_run = Workflow(
    "chaos_wait",
    [
        RESERVE,
        Step.sleep("cool", seconds=TIMER_S),
        Step.wait_for(
            "paid",
            event=WAIT_EVENT,
            match="input.order",
            timeout=WAIT_TIMEOUT_S,
            on_timeout=Default(TIMED_OUT),
        ),
    ],
)

registry = Registry([order, long_run, wait_run], [alpha, beta])
