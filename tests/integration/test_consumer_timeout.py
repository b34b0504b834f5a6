"""A step longer than the broker's consumer timeout, on a RabbitMQ node of this module's own
whose `consumer_timeout` is 3 s (checked every second: tests/chaos/instances.py).

An agent told the broker's timeout acknowledges the long step's request once its start is
confirmed: the broker never closes its channel and the step runs once. An agent that is not
told acknowledges after its reply: the broker closes its channel when the timeout passes and
hands the request to the other instance, which runs the same attempt again, and so on every
timeout until the request's own expiry (its wait budget) ends the chain. And a message being
confirmed on a channel the broker closes for its consumer timeout is to be sent again, not
refused (the close is a 406 PRECONDITION_FAILED, as for a message the broker refuses)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.errors import BrokerUnavailableError
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store.schema import steps
from sasflow.transport.base import Delivery, Outgoing
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness, private_services, services
from tests.chaos.instances import CHANNEL_TICK_MS, RabbitInstance

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONSUMER_TIMEOUT = 3.0
"""The node's `consumer_timeout` (seconds)."""
WORK = 2 * CONSUMER_TIMEOUT
"""How long the step works: twice the consumer timeout."""
POLICY = StepPolicy(timeout=4 * CONSUMER_TIMEOUT, wait_timeout=10.0)
"""Its budget is past half the consumer timeout (a long step); its requests expire 10 s after
their publish, requeued or not."""
TIMED_OUT = "timed out waiting for delivery acknowledgement"
"""What the node logs each time it closes a channel for its consumer timeout."""


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitInstance]:
    with private_services.rabbitmq(consumer_timeout=CONSUMER_TIMEOUT) as node:
        yield node


@dataclass
class Executions:
    """Each execution of the handler: (instance, attempt, monotonic start)."""

    seen: list[tuple[str, int, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def agent(self, label: str) -> Agent:
        """One instance's copy of agent `long`: its handler notes its runs, then works."""
        agent = Agent("long")

        @agent.handler("work")
        def work(call: Call) -> str:
            with self.lock:
                self.seen.append((label, call.attempt, time.monotonic()))
            call.cancelled.wait(WORK)
            return label

        return agent


def _timeouts_logged(node: RabbitInstance, offset: int) -> int:
    return node.log_file.read_bytes()[offset:].decode(errors="replace").count(TIMED_OUT)


def _log_size(node: RabbitInstance) -> int:
    return node.log_file.stat().st_size if node.log_file.exists() else 0


@dataclass(frozen=True)
class Outcome:
    executions: list[tuple[str, int, float]]
    timeouts: int
    """Channels the node closed for its consumer timeout."""
    reconnects: int
    """Times the first instance connected again."""
    acked_at_start: int
    attempts: int
    """The step's attempts (the scheduler dispatched it this many times)."""


def _run_long_step(
    engine: Engine, database_url: str, rabbit: RabbitInstance, told: float | None, linger: float
) -> Outcome:
    """Run the long step on instance `a` (told `told` as the consumer timeout), with instance
    `b` consuming the same queue from once `a` started it, until the run completed and
    `linger` seconds more."""
    names = Names(services.unique("sfct"))
    runs = Executions()
    first = runs.agent("a")
    registry = Registry(
        [Workflow("longrun", [Step("only", "long", "work", policy=POLICY)])], [first]
    )

    def instance(agent: Agent, transport: RabbitMQTransport) -> AgentWorker:
        return AgentWorker(
            agent, transport, names, concurrency=1, options=AgentOptions(consumer_timeout=told)
        )

    scheduler = Scheduler(
        engine,
        RabbitMQTransport(rabbit.url, process_name="test-scheduler"),
        registry,
        names,
        database_url=database_url,
        options=SchedulerOptions(),
    )
    transport_a = RabbitMQTransport(rabbit.url, process_name="test-agent-a")
    a = instance(first, transport_a)
    b = instance(runs.agent("b"), RabbitMQTransport(rabbit.url, process_name="test-agent-b"))
    offset = _log_size(rabbit)
    with engine.begin() as conn:
        submit_run(conn, registry, "longrun", {}, key="long", namespace=names.namespace)
    with harness.running(scheduler, a):
        harness.wait_for(lambda: len(runs.seen) == 1, timeout=30, what="the long step started")
        with harness.running(b):
            harness.wait_for(
                harness.all_runs_in(engine, {"completed"}, 1), timeout=30, what="the run completes"
            )
            time.sleep(linger)
    with engine.connect() as conn:
        attempts = conn.execute(select(steps.c.attempt)).scalar_one()
    return Outcome(
        executions=list(runs.seen),
        timeouts=_timeouts_logged(rabbit, offset),
        reconnects=transport_a.generation - 1,
        acked_at_start=a.stats.acked_at_start,
        attempts=attempts,
    )


def _describe(outcome: Outcome) -> str:
    start = outcome.executions[0][2]
    runs = ", ".join(f"{who}@{at - start:.1f}s" for who, _, at in outcome.executions)
    return (
        f"{len(outcome.executions)} executions ({runs}), {outcome.timeouts} channels closed "
        f"for the consumer timeout, instance a reconnected {outcome.reconnects} times, "
        f"{outcome.acked_at_start} acknowledged at start, {outcome.attempts} attempt(s)"
    )


def test_an_agent_told_the_timeout_runs_a_step_longer_than_it_once(
    engine: Engine, database_url: str, rabbit: RabbitInstance
) -> None:
    outcome = _run_long_step(engine, database_url, rabbit, told=CONSUMER_TIMEOUT, linger=0)
    print(f"\n[consumer timeout {CONSUMER_TIMEOUT:.0f}s, agents told] {_describe(outcome)}")
    assert [(who, attempt) for who, attempt, _ in outcome.executions] == [("a", 1)]
    assert (outcome.timeouts, outcome.reconnects, outcome.acked_at_start) == (0, 0, 1)
    assert outcome.attempts == 1


def test_an_agent_not_told_the_timeout_has_its_channel_closed_and_the_step_run_again(
    engine: Engine, database_url: str, rabbit: RabbitInstance
) -> None:
    # Until past the request's expiry: every redelivery the node was going to make is made.
    outcome = _run_long_step(
        engine, database_url, rabbit, told=None, linger=POLICY.wait_timeout + CONSUMER_TIMEOUT
    )
    print(f"\n[consumer timeout {CONSUMER_TIMEOUT:.0f}s, agents not told] {_describe(outcome)}")
    who = [label for label, _, _ in outcome.executions]
    assert who[:2] == ["a", "b"], "the request was not handed to the other instance"
    assert {attempt for _, attempt, _ in outcome.executions} == {1}, "one attempt, run again"
    assert outcome.timeouts >= len(outcome.executions) - 1 >= 1
    # Each run starts at least a timeout after the one before, and none once the request
    # expired (its wait budget, counted from its publish, redeliveries included).
    assert len(outcome.executions) <= POLICY.wait_timeout // CONSUMER_TIMEOUT + 1
    assert outcome.acked_at_start == 0
    assert outcome.attempts == 1


def test_a_channel_closed_for_the_consumer_timeout_during_a_publish_does_not_refuse_it(
    rabbit: RabbitInstance,
) -> None:
    """The broker closes the channel (406 PRECONDITION_FAILED, as it does for a message it
    refuses) because a delivery of it stayed unacknowledged: the message being confirmed is
    not refused for good (a scheduler would fail its step), it is to be sent again."""
    queue = f"{services.unique('sfct')}.held"
    transport = RabbitMQTransport(rabbit.url, process_name="test-held")
    try:
        _hold_one(transport, queue)
        # The broker closes the channel meanwhile; its close waits in the socket until the
        # publish below reads from it.
        time.sleep(CONSUMER_TIMEOUT + 2 * CHANNEL_TICK_MS / 1000)
        try:
            outcome: object = transport.publish_many([Outgoing("", queue, b"next")])
        except BrokerUnavailableError as exc:
            outcome = exc
        assert isinstance(outcome, BrokerUnavailableError), f"refused: {outcome!r}"
    finally:
        transport.close()


def _hold_one(transport: RabbitMQTransport, queue: str) -> None:
    """Connect, and consume one message of `queue` (made for it) without acknowledging it."""
    transport.connect()
    transport.declare_queue(queue, dead_letter_exchange=None)
    transport.publish(Outgoing("", queue, b"held"))
    held: list[Delivery] = []
    transport.consume(queue, held.append, prefetch=1)

    def delivered() -> bool:
        transport.process(0.1)
        return bool(held)

    harness.wait_for(delivered, what="the delivery")


def test_a_running_node_given_a_consumer_timeout_in_memory_applies_it_to_new_channels(
    rabbit: RabbitInstance,
) -> None:
    """How a chaos run on a running cluster gives its nodes the run's consumer timeout (their
    files have theirs), and puts their settings back at its end."""
    configured = {"consumer_timeout": round(CONSUMER_TIMEOUT * 1000), "channel_tick_interval": 1000}
    assert rabbit.settings("consumer_timeout", "channel_tick_interval") == configured
    before = rabbit.override_consumer_timeout(2.0)
    assert before == configured
    offset = _log_size(rabbit)
    transport = RabbitMQTransport(rabbit.url, process_name="test-held-in-memory")
    try:
        assert rabbit.settings("consumer_timeout")["consumer_timeout"] == 2000
        _hold_one(transport, f"{services.unique('sfct')}.held")
        harness.wait_for(
            lambda: _timeouts_logged(rabbit, offset) == 1,
            timeout=15,
            interval=0.2,
            what="the channel closed for the consumer timeout",
        )
        used = rabbit.log_file.read_bytes()[offset:].decode(errors="replace")
        assert "Timeout used: 2000 ms" in used
    finally:
        transport.close()
        rabbit.set_settings(before)
    assert rabbit.settings("consumer_timeout", "channel_tick_interval") == configured
