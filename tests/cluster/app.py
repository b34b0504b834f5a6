"""The cluster tier's app: a two-step job on one agent whose handler takes a little time (so
that steps are in flight when a node goes) and records every call it gets in a ledger the
test reads: which steps ran, under which attempt and key, how often."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sasflow import Backoff, BreakerPolicy, Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call

AGENT = "worker"
WORKFLOW = "cluster_job"
POLICY = StepPolicy(timeout=6, max_failures=10, backoff=Backoff(initial=0.2, maximum=1))
"""A lost request costs its 6 s deadline and a sweep; 10 failures allowed: no run may end in
`error` because of the faults."""


@dataclass
class Ledger:
    """Every call the agent got: (step id, attempt, idempotency key) with a count."""

    calls: Counter[tuple[int, int, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, call: Call) -> None:
        with self.lock:
            self.calls[(call.step_id, call.attempt, call.idempotency_key)] += 1

    def keys_by_step(self) -> dict[int, set[str]]:
        with self.lock:
            found: dict[int, set[str]] = {}
            for step_id, _attempt, key in self.calls:
                found.setdefault(step_id, set()).add(key)
            return found

    def executions(self) -> int:
        with self.lock:
            return sum(self.calls.values())


@dataclass(frozen=True)
class App:
    registry: Registry
    agent: Agent
    ledger: Ledger


def make_app() -> App:
    """A fresh app and ledger (one per test: no state shared between tests)."""
    ledger = Ledger()
    # A breaker gives each agent instance a breaker queue of its own.
    agent = Agent(AGENT, breakers={"remote": BreakerPolicy()})

    @agent.handler("work", dependency="remote")
    def work(call: Call) -> dict[str, Any]:
        ledger.record(call)
        time.sleep(float((call.input or {}).get("work", 0)))
        return {"attempt": call.attempt, "key": call.idempotency_key}

    job = Workflow(
        WORKFLOW,
        [
            Step("first", AGENT, "work", policy=POLICY),
            Step(
                "second",
                AGENT,
                "work",
                after=("first",),
                input=lambda ctx: {"work": ctx.run_input.get("work", 0)},
                policy=POLICY,
            ),
        ],
    )
    return App(Registry([job], [agent]), agent, ledger)
