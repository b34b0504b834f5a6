"""User code (input builders, `Workflow.output`) runs off the scheduler's loop and outside its
transactions, with a time budget: a slow one delays nothing else, one that overruns fails its
own step with the reason. On the real services."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, Step, StepContext, StepPolicy, Workflow
from sasflow.agents import Agent, Call
from sasflow.scheduler.advancing import AdvanceOptions
from sasflow.scheduler.usercode import UserCodeOptions
from sasflow.store.runs import deferred as deferred_store
from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

UNRELATED = 10
SLOW_BUILDER_S = 4.0


class App:
    """A slow builder (it waits until released or `SLOW_BUILDER_S`) in the `slow` workflow, and
    the one-step `quick` workflow whose steps have 1 s clocks, on one agent that counts the
    calls of each step."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.builder_started = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.agent = Agent("svc")

        @self.agent.handler("go")
        def go(call: Call) -> dict[str, Any]:
            with self._lock:
                self.calls[call.idempotency_key] += 1
            return {"seen": call.input}

        tight = StepPolicy(timeout=1.0, wait_timeout=1.0, max_failures=3)
        self.registry = Registry(
            [
                Workflow(
                    "slow",
                    [
                        Step("a", "svc", "go"),
                        Step("b", "svc", "go", input=self.slow_input),
                    ],
                ),
                Workflow("quick", [Step("only", "svc", "go", policy=tight)]),
            ],
            [self.agent],
        )

    def slow_input(self, ctx: StepContext) -> Any:
        self.builder_started.set()
        self.release.wait(SLOW_BUILDER_S)
        return {"a": ctx.outputs["a"]}


def _steps_of(engine: Engine, workflow: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(
                    steps.c.name,
                    steps.c.state,
                    steps.c.attempt,
                    steps.c.failure_count,
                    steps.c.idempotency_key,
                    steps.c.error,
                    steps.c.updated_at,
                    runs.c.finished_at,
                    runs.c.state.label("run_state"),
                )
                .join(runs, runs.c.id == steps.c.run_id)
                .where(runs.c.workflow == workflow)
            )
        )


def test_a_slow_input_builder_delays_no_other_run(
    engine: Engine, database_url: str, names: Names
) -> None:
    """While a builder takes 4 s, unrelated one-step runs (1 s clocks) submitted meanwhile all
    complete before it returns: none of their steps expires or counts a failure, and each
    handler runs exactly once. The slow run then completes with the input its builder made."""
    app = App()
    slow = harness.submit(engine, app.registry, names, "slow", key="s", run_input={"n": 0})
    with harness.running(
        harness.scheduler(engine, database_url, app.registry, names),
        harness.agent(app.agent, names),
    ):
        assert app.builder_started.wait(30), "the slow builder never started"
        for i in range(UNRELATED):
            harness.submit(engine, app.registry, names, "quick", key=f"q{i}", run_input={"i": i})
        harness.wait_for(
            lambda: (
                all(r.run_state == "completed" for r in _steps_of(engine, "quick"))
                and len(_steps_of(engine, "quick")) == UNRELATED
            ),
            what="the unrelated runs completed",
        )
        assert not app.release.is_set()
        quick_done = max(r.finished_at for r in _steps_of(engine, "quick"))
        harness.wait_for(
            harness.all_runs_in(engine, {"completed"}, UNRELATED + 1), what="the slow run"
        )
    quick = _steps_of(engine, "quick")
    assert [(r.state, r.attempt, r.failure_count) for r in quick] == [("processed", 1, 0)] * 10
    assert sorted(app.calls[r.idempotency_key] for r in quick) == [1] * UNRELATED
    with engine.connect() as conn:
        b_ready = conn.execute(
            select(events.c.created_at).where(
                events.c.run_id == slow, events.c.step == "b", events.c.to_state == "pending"
            )
        ).scalar_one()
    # Step b was made ready (its builder returned) after every unrelated run had finished.
    assert quick_done < b_ready
    assert [r.input for r in harness.step_rows(engine, slow) if r.name == "b"] == [
        {"a": {"seen": {"n": 0}}}
    ]


def test_a_builder_past_its_time_budget_fails_its_own_step_with_the_reason(
    engine: Engine, database_url: str, names: Names
) -> None:
    """With a 0.5 s budget the 4 s builder fails step b (and its run) with the reason, while
    an unrelated run completes; the builder's late result is discarded."""
    app = App()
    slow = harness.submit(engine, app.registry, names, "slow", key="s", run_input={"n": 0})
    budget = AdvanceOptions(user_code=UserCodeOptions(budget_s=0.5))
    try:
        with harness.running(
            harness.scheduler(engine, database_url, app.registry, names, advance=budget),
            harness.agent(app.agent, names),
        ):
            assert app.builder_started.wait(30), "the slow builder never started"
            harness.submit(engine, app.registry, names, "quick", key="q", run_input={})
            harness.wait_for(
                lambda: harness.run_states(engine).get(slow) == "error", what="slow run failed"
            )
            harness.wait_for(
                lambda: "completed" in harness.run_states(engine).values(), what="quick run"
            )
    finally:
        app.release.set()
    b = next(r for r in harness.step_rows(engine, slow) if r.name == "b")
    assert (b.state, b.error) == (
        "error",
        {
            "type": "BuilderTimeoutError",
            "message": "step 'b': input builder exceeded its time budget of 0.5s",
        },
    )
    assert b.input is None


def test_a_built_input_the_database_cannot_hold_fails_its_step_not_the_scheduler(
    engine: Engine, database_url: str, names: Names
) -> None:
    """A builder returning a NUL character (which PostgreSQL's jsonb cannot hold) fails its
    step with the reason, checked on the pool; the scheduler goes on with the other runs."""
    svc = Agent("svc")

    @svc.handler("go")
    def go(call: Call) -> dict[str, Any]:
        return {}

    registry = Registry(
        [
            Workflow("nul", [Step("a", "svc", "go"), Step("b", "svc", "go", input=_nul)]),
            Workflow("quick", [Step("only", "svc", "go")]),
        ],
        [svc],
    )
    bad = harness.submit(engine, registry, names, "nul", key="n", run_input={})
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(svc, names)
    ):
        harness.wait_for(lambda: harness.run_states(engine).get(bad) == "error", what="nul")
        good = harness.submit(engine, registry, names, "quick", key="q", run_input={})
        harness.wait_for(lambda: harness.run_states(engine).get(good) == "completed")
    b = next(r for r in harness.step_rows(engine, bad) if r.name == "b")
    assert b.state == "error"
    assert b.error["type"] == "InvalidInputError"
    assert b.error["message"] == (
        "step 'b': input is not JSON: value holds a NUL character (\\u0000), which cannot be stored"
    )


def _nul(ctx: StepContext) -> Any:
    return {"text": "a\u0000b"}


def test_a_built_input_the_store_refuses_fails_its_step_and_the_others_go_on(
    engine: Engine, database_url: str, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the store refuses a batch of built runs for another reason than being away, each
    run is advanced alone; the one refused alone fails the step it built with the store's
    reason, the other completes, and the scheduler's loop goes on."""
    original = deferred_store.advance

    def refusing(conn: Any, registry: Any, built: Any, **kwargs: Any) -> Any:
        if any(v == {"poison": True} for made in built.values() for v in made.inputs.values()):
            raise ValueError("value refused by the store")
        return original(conn, registry, built, **kwargs)

    monkeypatch.setattr(deferred_store, "advance", refusing)
    svc = Agent("svc")

    @svc.handler("go")
    def go(call: Call) -> dict[str, Any]:
        return {"key": call.input.get("key")} if isinstance(call.input, dict) else {}

    registry = Registry(
        [Workflow("pick", [Step("a", "svc", "go"), Step("b", "svc", "go", input=_poison)])],
        [svc],
    )
    bad = harness.submit(engine, registry, names, "pick", key="bad", run_input={"key": "bad"})
    good = harness.submit(engine, registry, names, "pick", key="good", run_input={"key": "good"})
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(svc, names)
    ):
        harness.wait_for(
            lambda: harness.run_states(engine) == {bad: "error", good: "completed"},
            what="the poisoned run failed, the other completed",
        )
    b = next(r for r in harness.step_rows(engine, bad) if r.name == "b")
    assert b.error == {
        "type": "InvalidInputError",
        "message": "step 'b': input the store refused it: value refused by the store",
    }


def _poison(ctx: StepContext) -> Any:
    return {"poison": True} if ctx.run_input["key"] == "bad" else ctx.outputs["a"]
