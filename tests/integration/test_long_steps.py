"""Long steps and the broker's consumer timeout, on the real broker: a step whose budget is at
least half the consumer timeout has its request acknowledged once its start is confirmed (the
broker can then neither time the delivery out nor redeliver it mid-step), and still completes
with its reply; a short step's request stays unacknowledged until its reply."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.store.schema import steps
from sasflow.transport.topology import Names
from tests import harness, services

pytestmark = pytest.mark.integration

CONSUMER_TIMEOUT = 20.0
"""What the agent is told the broker's consumer timeout is (the broker's own is not changed):
steps of 10 s or more are long."""


def _unacknowledged(queue: str) -> int:
    """The broker's count of deliveries of `queue` not acknowledged yet."""
    figure = services.queue_figure(queue, "messages_unacknowledged")
    if figure is None:
        raise AssertionError(f"queue {queue} not listed")
    return figure


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _run_one(
    engine: Engine,
    database_url: str,
    names: Names,
    release: threading.Event,
    *,
    timeout: float,
) -> tuple[int, int]:
    """Run one step of `timeout` whose handler waits for `release`; returns the agent queue's
    unacknowledged count while the handler runs (its start applied) and the early acks."""
    agent = Agent("long")

    @agent.handler("wait")
    def wait(call: Call) -> str:
        release.wait(call.remaining())
        return "done"

    registry = Registry(
        [Workflow("longrun", [Step("only", "long", "wait", policy=StepPolicy(timeout=timeout))])],
        [agent],
    )
    with engine.begin() as conn:
        submit_run(conn, registry, "longrun", {}, key="k", namespace=names.namespace)
    worker = AgentWorker(
        agent,
        harness.transport("agent-long"),
        names,
        options=AgentOptions(consumer_timeout=CONSUMER_TIMEOUT),
    )
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):

        def started() -> bool:
            with engine.connect() as conn:
                return conn.execute(select(steps.c.started_at)).scalar_one() is not None

        harness.wait_for(started, what="the start applied")
        harness.wait_for(
            lambda: worker.stats.started == 1, what="the started message confirmed", timeout=5
        )
        harness.wait_for(
            lambda: _unacknowledged(names.agent("long")) == (0 if timeout >= 10 else 1),
            what="the expected acknowledgement state",
            timeout=5,
            interval=0.2,
        )
        unacked = _unacknowledged(names.agent("long"))
        release.set()
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")
    return unacked, worker.stats.acked_at_start


def test_a_long_steps_request_is_acknowledged_when_it_starts_and_its_reply_still_counts(
    engine: Engine, database_url: str, names: Names, release: threading.Event
) -> None:
    unacked, early = _run_one(engine, database_url, names, release, timeout=10)
    assert (unacked, early) == (0, 1)


def test_a_short_steps_request_stays_unacknowledged_until_its_reply(
    engine: Engine, database_url: str, names: Names, release: threading.Event
) -> None:
    unacked, early = _run_one(engine, database_url, names, release, timeout=9)
    assert (unacked, early) == (1, 0)
