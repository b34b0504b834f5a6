"""The embedded default (SQLite and the in-process bus) stops a cancelled step at its agent as
the production pair does: the relay's `Cancel` reaches the agent over the in-process bus, the
handler sees `call.cancelled` and returns, and its return value is never applied."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.agents.worker import AgentWorker
from sasflow.ops.cancel import cancel
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store.schema import steps
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration


def test_a_cancel_reaches_the_agent_over_the_in_process_bus(
    sqlite_engine: Engine, sqlite_url: str
) -> None:
    names = Names("embedded")
    started, returned, release = threading.Event(), threading.Event(), threading.Event()
    agent = Agent("worker")

    @agent.handler("loop")
    def loop(call: Call) -> str:
        started.set()
        while not call.cancelled.wait(0.05) and not release.is_set():
            pass
        returned.set()
        return "stopped early"

    registry = Registry(
        [Workflow("loop", [Step("only", "worker", "loop", policy=StepPolicy(timeout=60))])],
        [agent],
    )
    with sqlite_engine.begin() as conn:
        run_id = submit_run(conn, registry, "loop", {}, key="k", namespace=names.namespace).run_id
    broker = MemoryBroker()
    worker = AgentWorker(agent, MemoryTransport(broker, process_name="agent"), names)
    scheduler = Scheduler(
        sqlite_engine,
        MemoryTransport(broker, process_name="scheduler"),
        registry,
        names,
        database_url=sqlite_url,
        options=SchedulerOptions(rescan_interval=0.2),
    )
    try:
        with harness.running(scheduler, worker):
            harness.wait_for(started.is_set, what="the handler started")
            with sqlite_engine.begin() as conn:
                cancel(conn, run_id, actor="ann", reason="stop", namespace=names.namespace)
            harness.wait_for(returned.is_set, timeout=10, what="the handler returned")
            assert not release.is_set()
    finally:
        release.set()
    with sqlite_engine.connect() as conn:
        step = conn.execute(select(steps).where(steps.c.run_id == run_id)).one()
    assert (step.state, step.failure_count, step.output) == ("cancelled", 0, None)
    assert (worker.stats.cancelled, worker.stats.replied_ok) == (1, 0)
