"""An app for the observability tests: one run that retries inside its agent and is expired once
by the supervisor, so its trace holds every kind of hop."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sasflow import Backoff, Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call, TransientError
from sasflow.policy import BreakerPolicy, RetryPolicy

observed = Agent("observed", breakers={"remote": BreakerPolicy(fail_max=5, reset_timeout=5)})
_seen: set[str] = set()
_lock = threading.Lock()
log = logging.getLogger(__name__)


@observed.handler("flaky", dependency="remote", retry=RetryPolicy(initial=0.01, maximum=0.05))
def flaky(call: Call) -> dict[str, Any]:
    """Fails transiently on its first call for a key, then answers."""
    with _lock:
        first = call.idempotency_key not in _seen
        _seen.add(call.idempotency_key)
    if first:
        raise TransientError("the remote service hiccuped")
    return {"text": str(call.input["text"]).upper()}


@observed.handler("late")
def late(call: Call) -> dict[str, Any]:
    """Outlives its 1 s deadline on the first attempt (the supervisor expires it), then
    answers at once."""
    log.info("late: attempt %d", call.attempt)
    if call.attempt == 1:
        time.sleep(1.5)
    return {"attempt": call.attempt}


traced = Workflow(
    "traced",
    [
        Step("first", "observed", "flaky", policy=StepPolicy(timeout=10)),
        Step(
            "second",
            "observed",
            "late",
            policy=StepPolicy(timeout=1, max_failures=3, backoff=Backoff(initial=0.1, maximum=0.1)),
        ),
    ],
)

registry = Registry([traced], [observed])
