"""Agent pools on the embedded default (SQLite and the in-process bus): a pooled step goes to
its pool's agent; a step of a pool without agent waits, then fails at the look limit."""

from __future__ import annotations

from sqlalchemy import Engine, select

from sasflow.agents.worker import AgentWorker
from sasflow.commands import NewRun
from sasflow.messages import DEFAULT_LIMITS
from sasflow.ops.submit import submit_run
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.states import RunState, StepState
from sasflow.store.db import Connection, run_transaction
from sasflow.store.runs.pools import PoolLimits
from sasflow.store.schema import steps
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import basic


def test_pools_over_the_in_process_bus(sqlite_engine: Engine, sqlite_url: str) -> None:
    """At the look limit: 3 looks, the third fails the step (2 counted)."""
    looks = _served_and_orphan(sqlite_engine, sqlite_url, PoolLimits(max_looks=3))
    assert looks == 2


def test_a_pool_step_fails_at_the_age_limit_too(sqlite_engine: Engine, sqlite_url: str) -> None:
    """At the age limit: the step fails once it has waited longer than give_up_s, however
    few looks that took."""
    looks = _served_and_orphan(
        sqlite_engine, sqlite_url, PoolLimits(give_up_s=0.5, max_looks=1_000_000)
    )
    assert 1 <= looks < 1_000_000


def _served_and_orphan(sqlite_engine: Engine, sqlite_url: str, limits: PoolLimits) -> int:
    """Run a gpu-pool run (served) and a cpu-pool run (no agent); return the cpu step's looks."""
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
        options=SchedulerOptions(rescan_interval=0.05, pool_limits=limits),
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
    assert (step.state, step.error["message"]) == (StepState.ERROR, "no agent in pool cpu")
    assert agent.stats.received == 2
    return int(step.pool_looks)
