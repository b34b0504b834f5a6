"""Agents on the real broker: retries inside the deadline, silence past it, permanent errors,
circuit breakers that defer instead of failing, and poison requests dead-lettered."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow import BreakerPolicy, Registry, RetryPolicy, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call, PermanentError, TransientError
from sasflow.store.schema import events, runs
from sasflow.transport.topology import SOURCE_HEADER, Names
from tests import harness, services

pytestmark = pytest.mark.integration


def _one_step(agent: Agent, action: str, timeout: float, **step: Any) -> Registry:
    flow = Workflow(
        "solo", [Step("only", agent.name, action, policy=StepPolicy(timeout=timeout), **step)]
    )
    return Registry([flow], [agent])


def _step_events(engine: Engine) -> list[tuple[str | None, str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(events.c.from_state, events.c.to_state, events.c.reason)
            .where(events.c.entity == "step")
            .order_by(events.c.id)
        )
        return [(r.from_state, r.to_state, r.reason) for r in rows]


def test_transient_errors_are_retried_but_never_past_the_deadline_then_count_one_failure(
    engine: Engine, database_url: str, names: Names
) -> None:
    """Retries use backoff and stop before the deadline; the agent then replies `failed`, which
    counts one failure at once (here the step's only allowed one, so the step and run fail)."""
    flaky = Agent("flaky", retry=RetryPolicy(initial=0.05, maximum=0.2))
    calls: list[float] = []

    @flaky.handler("always")
    def always(call: Call) -> None:
        calls.append(time.monotonic())
        raise TransientError("remote busy")

    flow = Workflow(
        "solo", [Step("only", "flaky", "always", policy=StepPolicy(timeout=3, max_failures=1))]
    )
    registry = Registry([flow], [flaky])
    with engine.begin() as conn:
        submit_run(conn, registry, "solo", {}, key="k", namespace=names.namespace)
    worker = harness.agent(flaky, names)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(harness.all_runs_in(engine, {"error"}, 1), what="run fails")
    assert len(calls) >= 3, "transient errors were not retried"
    assert calls[-1] - calls[0] < 3 * 0.9, "an attempt started in the margin kept for the reply"
    assert (worker.stats.replied_failed, worker.stats.replied_ok) == (1, 0)
    (step,) = harness.step_rows(engine)
    assert (step.state, step.attempt, step.failure_count) == ("error", 1, 1)
    assert (step.error["type"], step.error["message"]) == ("TransientError", "remote busy")
    assert step.error["traceback"].endswith("TransientError: remote busy\n")


def test_handler_still_running_at_the_deadline_produces_no_reply(
    engine: Engine, database_url: str, names: Names
) -> None:
    slow = Agent("slow")
    finished = threading.Event()

    @slow.handler("crawl")
    def crawl(call: Call) -> dict[str, str]:
        time.sleep(1.2)
        finished.set()
        return {"late": "yes"}

    registry = _one_step(slow, "crawl", timeout=0.5)
    with engine.begin() as conn:
        submit_run(conn, registry, "solo", {}, key="k", namespace=names.namespace)
    worker = harness.agent(slow, names)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(finished.is_set, what="handler returns")
        time.sleep(0.3)
    assert worker.stats.abandoned == 1
    assert worker.stats.replied_ok == 0
    (step,) = harness.step_rows(engine)
    assert (step.state, step.output) == ("processing", None)


def test_permanent_error_fails_the_step_and_the_run_with_the_reason(
    engine: Engine, database_url: str, names: Names
) -> None:
    """A permanent error is replied at once (no retries): the step and the run go to error,
    the remaining steps are skipped, and the reason is kept."""
    payments = Agent("payments")
    attempts: list[str] = []

    @payments.handler("charge")
    def charge(call: Call) -> None:
        attempts.append(call.idempotency_key)
        raise PermanentError("card declined")

    @payments.handler("receipt")
    def receipt(call: Call) -> None:
        raise AssertionError("must not run")

    flow = Workflow(
        "pay", [Step("charge", "payments", "charge"), Step("receipt", "payments", "receipt")]
    )
    registry = Registry([flow], [payments])
    with engine.begin() as conn:
        run = submit_run(conn, registry, "pay", {"amount": 5}, key="k", namespace=names.namespace)
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(payments, names)
    ):
        harness.wait_for(harness.all_runs_in(engine, {"error"}, 1), what="run fails")
    assert len(attempts) == 1
    with engine.connect() as conn:
        error = conn.execute(select(runs.c.error).where(runs.c.id == run.run_id)).scalar_one()
    assert error["step"] == "charge"
    assert (error["error"]["type"], error["error"]["message"]) == (
        "PermanentError",
        "card declined",
    )
    assert 'raise PermanentError("card declined")' in error["error"]["traceback"]
    states = {r.name: r.state for r in harness.step_rows(engine)}
    assert states == {"charge": "error", "receipt": "skipped"}


def test_open_breaker_defers_steps_without_counting_failures_then_they_complete(
    engine: Engine, database_url: str, names: Names
) -> None:
    """While the dependency is down the breaker opens; steps are parked (pending, not_before)
    with failure_count 0 instead of burning retries; once it is back every run completes."""
    remote_up = threading.Event()
    calls = {"down": 0, "up": 0}
    shipping = Agent(
        "shipping",
        breakers={"carrier": BreakerPolicy(fail_max=2, reset_timeout=0.5)},
        retry=RetryPolicy(initial=0.01, maximum=0.02, max_attempts=2),
    )

    @shipping.handler("ship", dependency="carrier")
    def ship(call: Call) -> dict[str, str]:
        if not remote_up.is_set():
            calls["down"] += 1
            raise ConnectionError("carrier unreachable")
        calls["up"] += 1
        return {"tracking": call.idempotency_key[:8]}

    registry = _one_step(shipping, "ship", timeout=5)
    with engine.begin() as conn:
        for i in range(6):
            submit_run(
                conn, registry, "solo", {"parcel": i}, key=f"p{i}", namespace=names.namespace
            )
    worker = harness.agent(shipping, names, concurrency=3)
    with harness.running(
        harness.scheduler(engine, database_url, registry, names, rescan_interval=0.2), worker
    ):
        harness.wait_for(lambda: worker.stats.deferred >= 6, what="steps deferred")
        assert calls["down"] <= 2 + 3, "an open breaker kept calling the dead service"
        parked = harness.step_rows(engine)
        assert {r.failure_count for r in parked} == {0}
        remote_up.set()
        harness.wait_for(
            harness.all_runs_in(engine, {"completed"}, 6),
            timeout=30,
            what="runs complete once the carrier is back",
        )
    assert worker.breaker("carrier").state == "closed"
    assert {r.failure_count for r in harness.step_rows(engine)} == {0}
    assert calls["up"] == 6
    deferrals = [e for e in _step_events(engine) if e == ("processing", "pending", "deferred")]
    assert len(deferrals) >= 6


def test_malformed_and_misrouted_requests_are_dead_lettered_and_the_agent_keeps_serving(
    engine: Engine, database_url: str, names: Names
) -> None:
    echo = Agent("echoer")

    @echo.handler("say")
    def say(call: Call) -> Any:
        return call.input

    registry = _one_step(echo, "say", timeout=5)
    worker = harness.agent(echo, names)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(
            lambda: services.queue_exists(names.agent("echoer")),
            what="the agent declared its queue",
        )
        harness.publish_raw(names.agent("echoer"), b"[]")
        harness.publish_raw(names.agent("echoer"), b'{"step_id": 1}')
        harness.publish_raw(
            names.agent("echoer"),
            (
                b'{"step_id": 9, "run_id": 9, "attempt": 1, "workflow": "w", "step": "s",'
                b' "agent": "other", "action": "say", "idempotency_key": "k", "budget_ms": 1000,'
                b' "complete_by": "2030-01-01T00:00:00+00:00"}'
            ),
        )
        dead = harness.dead_letters(names, 3)
        with engine.begin() as conn:
            submit_run(
                conn, registry, "solo", {"still": "serving"}, key="k", namespace=names.namespace
            )
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")
    reasons = [str(d["reason"]) for d in dead]
    assert "must be a JSON object" in reasons[0]
    assert "budget_ms" in reasons[1]
    assert "for agent 'other'" in reasons[2]
    assert {d["headers"][SOURCE_HEADER] for d in dead} == {names.agent("echoer")}
    assert worker.stats.dead_lettered == 3


def test_unstorable_handler_output_fails_the_step_with_the_reason_and_the_agent_survives(
    engine: Engine, database_url: str, names: Names
) -> None:
    """Output with a NUL character or a lone surrogate (jsonb and UTF-8 cannot hold them), and
    an error message with them, become `error` replies with a readable reason."""
    odd = Agent("odd")

    @odd.handler("nul")
    def nul(call: Call) -> str:
        return "a\x00b"

    @odd.handler("surrogate")
    def surrogate(call: Call) -> dict[str, str]:
        return {"name": "\udcff"}

    @odd.handler("bad_message")
    def bad_message(call: Call) -> None:
        raise PermanentError("broken \x00 text \ud800")

    flow = Workflow(
        "odd",
        [
            Step("nul", "odd", "nul", after=()),
            Step("surrogate", "odd", "surrogate", after=()),
            Step("bad_message", "odd", "bad_message", after=()),
        ],
    )
    registry = Registry([flow], [odd])
    with engine.begin() as conn:
        submit_run(conn, registry, "odd", {}, key="k", namespace=names.namespace)
    worker = harness.agent(odd, names)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(
            lambda: {r.state for r in harness.step_rows(engine)} == {"error"},
            what="all three steps fail",
        )
    errors = {r.name: r.error for r in harness.step_rows(engine)}
    assert errors["nul"]["type"] == "InvalidOutputError"
    assert "NUL" in errors["nul"]["message"]
    assert errors["surrogate"]["type"] == "InvalidOutputError"
    stored = errors["bad_message"]
    assert (stored["type"], stored["message"]) == (
        "PermanentError",
        "broken \\0 text \\ud800",
    )
    assert "\x00" not in stored["traceback"]
    assert set(harness.run_states(engine).values()) == {"error"}
