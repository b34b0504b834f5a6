"""A step under a concurrency limit runs at most once per attempt, on the real broker: its
request goes out `exclusive` and the agent acknowledges it before the handler starts, so an
agent whose connection drops mid-step (a broker restart, a network cut) leaves no copy at the
broker to be delivered to another agent beside it. Without that, the broker redelivers the
request at once and two executions of one key run together, whatever the limit says (found by
the chaos suite's per-account check: the attempt a broker restart resurrected ran beside the
next one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine

from sasflow import Backoff, Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.agents.worker import AgentWorker
from sasflow.errors import BrokerUnavailableError
from sasflow.ops import limits as limit_ops
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store.flow.model import KeyExpr, Limit
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.base import Outgoing
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness, services
from tests.proxy import Proxy, closed_port, url_through

pytestmark = pytest.mark.integration


class Executions:
    """Which agent ran which attempt, and the most handlers running at once."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []
        self.now = self.most = 0
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def agent(self, label: str) -> Agent:
        agent = Agent("acct")

        @agent.handler("charge")
        def charge(call: Call) -> str:
            with self._lock:
                self.runs.append((label, call.attempt))
                self.now += 1
                self.most = max(self.most, self.now)
            try:
                self.gate.wait(call.remaining())
            finally:
                with self._lock:
                    self.now -= 1
            return label

        return agent


@pytest.fixture
def executions() -> Iterator[Executions]:
    seen = Executions()
    yield seen
    seen.gate.set()


def _consumers(queue: str) -> int:
    """The broker's count of consumers of `queue` (0 while it is not listed)."""
    return services.queue_figure(queue, "consumers") or 0


class UnconfirmedOnce(RabbitMQTransport):
    """A scheduler's transport whose first batch of requests reaches the queue, but the
    connection fails before the broker's confirms come back (as in a broker restart)."""

    def __init__(self, queue: str) -> None:
        super().__init__(services.broker_url(), process_name="test-scheduler-unconfirmed")
        self.queue = queue
        self.failed = False

    def publish_many(self, messages: Sequence[Outgoing]) -> list[Exception | None]:
        results = super().publish_many(messages)
        if not self.failed and any(m.routing_key == self.queue for m in messages):
            self.failed = True
            raise BrokerUnavailableError("connection lost before the confirms (simulated)")
        return results


def _limited(engine: Engine, names: Names, registry: Registry) -> int:
    """One charge at a time per account; one run."""
    limit = Limit(
        "per-account",
        "acct",
        actions=("charge",),
        key=KeyExpr.parse("input.account"),
        concurrency=1,
    )
    with engine.begin() as conn:
        limit_ops.set_limit(conn, limit, actor="test", reason="test", namespace=names.namespace)
        return submit_run(
            conn, registry, "pay", {"account": "a-1"}, key="k", namespace=names.namespace
        ).run_id


def _step(engine: Engine) -> Any:
    (step,) = harness.step_rows(engine)
    return step


def test_a_limited_step_is_not_run_again_beside_itself_when_its_agents_connection_drops(
    engine: Engine, database_url: str, names: Names, executions: Executions
) -> None:
    """Agent X takes the one step (one charge at a time per account) and starts it; then its
    connection is cut for good while the handler runs, with agent Y consuming the same queue.
    Y must not run that attempt beside X: the step waits for its execution clock (3 s, one
    failure), then its next attempt runs at Y."""
    x, y = executions.agent("x"), executions.agent("y")
    policy = StepPolicy(timeout=3, max_failures=5, backoff=Backoff(initial=0.1, maximum=0.1))
    registry = Registry([Workflow("pay", [Step("charge", "acct", "charge", policy=policy)])], [x])
    run_id = _limited(engine, names, registry)
    supervisor = Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(interval=0.1),
    )
    queue = names.agent("acct")
    with Proxy(int(urlsplit(services.broker_url()).port or 5672)) as proxy:
        agent_x = AgentWorker(
            x,
            RabbitMQTransport(
                url_through(services.broker_url(), proxy.port), process_name="test-agent-x"
            ),
            names,
            concurrency=1,
        )
        scheduler = harness.scheduler(engine, database_url, registry, names, rescan_interval=0.1)
        with harness.running(scheduler, supervisor, agent_x):
            harness.wait_for(lambda: _step(engine).started_at is not None, what="X started it")
            with harness.running(harness.agent(y, names, concurrency=1)):
                harness.wait_for(
                    lambda: _consumers(queue) == 2, what="Y consuming too", interval=0.2
                )
                proxy.backend = closed_port()  # X cannot come back
                proxy.cut()  # X's connection is cut
                harness.wait_for(lambda: _consumers(queue) == 1, what="X gone", interval=0.2)
                # X's handler runs to its deadline; then the step is expired and run again.
                harness.wait_for(lambda: len(executions.runs) == 2, timeout=20, what="a retry")
                executions.gate.set()
                harness.wait_for(
                    lambda: harness.run_states(engine) == {run_id: "completed"},
                    what="the run completes",
                )
    step = _step(engine)
    assert executions.most == 1, f"two executions at once: {executions.runs}"
    assert executions.runs == [("x", 1), ("y", 2)]
    assert (step.attempt, step.failure_count, step.output) == (2, 1, "y")
    assert agent_x.stats.acked_at_take == 1


def test_a_limited_step_whose_request_may_have_reached_the_queue_is_not_claimed_again(
    engine: Engine, database_url: str, names: Names, executions: Executions
) -> None:
    """The scheduler publishes the request, then loses the connection before the confirm: the
    request may be in the queue (here it is). Released, the step would be claimed again and
    its next attempt run beside the first; kept processing, its first attempt runs alone."""
    agent = executions.agent("a")
    policy = StepPolicy(timeout=10, max_failures=5)
    registry = Registry(
        [Workflow("pay", [Step("charge", "acct", "charge", policy=policy)])], [agent]
    )
    run_id = _limited(engine, names, registry)
    transport = UnconfirmedOnce(names.agent("acct"))
    scheduler = Scheduler(
        engine,
        transport,
        registry,
        names,
        database_url=database_url,
        options=SchedulerOptions(rescan_interval=0.1),
    )
    with harness.running(scheduler, harness.agent(agent, names, concurrency=2)):
        harness.wait_for(lambda: transport.failed, what="the lost confirm")
        harness.wait_for(lambda: len(executions.runs) == 1, what="the request taken")
        time.sleep(1.0)  # room for a second attempt to be claimed and to arrive
        executions.gate.set()
        harness.wait_for(
            lambda: harness.run_states(engine) == {run_id: "completed"}, what="the run completes"
        )
    step = _step(engine)
    assert executions.most == 1, f"two executions at once: {executions.runs}"
    assert executions.runs == [("a", 1)]
    assert (step.attempt, step.failure_count) == (1, 0)
