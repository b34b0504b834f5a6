"""Agent pools on the embedded default (SQLite and the in-process bus): a pooled step goes to
its pool's agent; a step of a pool without agent waits, then fails at the look limit."""

from __future__ import annotations

from sqlalchemy import Engine, select

from sasflow.agents.worker import AgentWorker
from sasflow.messages import DEFAULT_LIMITS
from sasflow.ops.submit import submit_run
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.states import RunState, StepState
from sasflow.store.commands import NewRun
from sasflow.store.db import Connection, run_transaction
from sasflow.store.pools import PoolLimits
from sasflow.store.schema import steps
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import basic


def test_pools_over_the_in_process_bus(sqlite_engine: Engine, sqlite_url: str) -> None:
    names = Names("embedded-pools")
    broker = MemoryBroker()

    def submit(pool: str) -> int:
        def work(conn: Connection) -> int:
            new = NewRun(workflow="pipeline", input={"text": "x"}, pool=pool)
            return submit_run(
                conn,
                basic.registry,
                new,
                actor="t",
                namespace=names.namespace,
                limits=DEFAULT_LIMITS,
            ).run_id

        return run_transaction(sqlite_engine, work)

    served, orphan = submit("gpu"), submit("cpu")
    scheduler = Scheduler(
        sqlite_engine,
        MemoryTransport(broker, process_name="sasflow-scheduler"),
        basic.registry,
        names,
        database_url=sqlite_url,
        options=SchedulerOptions(rescan_interval=0.05, pool_limits=PoolLimits(max_looks=3)),
    )
    agent = AgentWorker(
        basic.echo, MemoryTransport(broker, process_name="agent"), names, pool="gpu"
    )
    with harness.running(scheduler, agent):
        harness.wait_for(
            lambda: (
                harness.run_states(sqlite_engine)
                == {served: RunState.COMPLETED, orphan: RunState.ERROR}
            ),
            what="the gpu run completed and the cpu run failed",
        )
    with sqlite_engine.connect() as conn:
        step = conn.execute(
            select(steps).where(steps.c.run_id == orphan, steps.c.name == "a")
        ).one()
    assert (step.state, step.pool_looks, step.error["message"]) == (
        StepState.ERROR,
        2,
        "no agent in pool cpu",
    )
    assert agent.stats.received == 2
