"""The roles of a cluster test, in threads of the test process, each with the cluster's broker
list and quorum work queues; a paced load of submissions over AMQP; and what the store shows
afterwards (runs, step completions, the gap a fault left)."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Engine, func, select

from sasflow.agents.worker import AgentWorker
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store.schema import events, runs, steps
from sasflow.submitter import Submitter
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.connection import BrokerOptions
from sasflow.transport.queues import QueueOptions, QueueType
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.transport.topology import Names
from tests import harness
from tests.chaos.broker import Publisher
from tests.cluster.app import WORKFLOW, App, make_app

QUORUM = BrokerOptions(queues=QueueOptions(type=QueueType.QUORUM), heartbeat=5)
"""Quorum work queues; heartbeats every 5 s (a node that dies without closing its sockets is
noticed within about 10 s; a SIGKILLed one closes them at once)."""


def transport(broker_url: str, role: str) -> RabbitMQTransport:
    return RabbitMQTransport(broker_url, process_name=f"cluster-test-{role}", options=QUORUM)


@contextlib.contextmanager
def roles(
    app: App,
    names: Names,
    *,
    broker_url: str,
    database_url: str,
    engine: Engine,
    agents: int = 2,
) -> Iterator[list[AgentWorker]]:
    """A submitter, two schedulers, `agents` agents and a supervisor, running until the block
    ends: every role of a deployment twice where two may run, as a cluster's users would."""
    schedulers = [
        Scheduler(
            engine,
            transport(broker_url, f"scheduler-{n}"),
            app.registry,
            names,
            database_url=database_url,
            options=SchedulerOptions(rescan_interval=0.5),
        )
        for n in (1, 2)
    ]
    workers = [
        AgentWorker(app.agent, transport(broker_url, f"agent-{n}"), names, concurrency=4)
        for n in range(1, agents + 1)
    ]
    submitter = Submitter(engine, transport(broker_url, "submitter"), app.registry, names)
    supervisor = Supervisor(
        engine,
        names,
        transport=transport(broker_url, "supervisor"),
        options=SupervisorOptions(interval=0.5, lease_ttl=3),
    )
    with harness.running(submitter, *schedulers, *workers, supervisor, join_timeout=60):
        yield workers


class Load(threading.Thread):
    """Submits `runs` runs over `seconds` to `<ns>.submit`, each `work` seconds a step
    (confirmed; republished across node losses until confirmed: a duplicate is one run, by
    its key)."""

    def __init__(
        self, broker_url: str, names: Names, *, runs: int, seconds: float, work: float = 0.2
    ) -> None:
        super().__init__(name="cluster-load", daemon=True)
        self.broker_url = broker_url
        self.names = names
        self.runs = runs
        self.seconds = seconds
        self.work = work
        self.confirmed: list[str] = []
        self.unconfirmed: list[str] = []

    def run(self) -> None:
        publisher = Publisher(self.broker_url)
        began = time.monotonic()
        try:
            for n in range(self.runs):
                key = f"k-{n}"
                body = json.dumps(
                    {"workflow": WORKFLOW, "key": key, "input": {"work": self.work}}
                ).encode()
                if publisher.publish(self.names.submit, body, deadline=time.monotonic() + 60):
                    self.confirmed.append(key)
                else:
                    self.unconfirmed.append(key)
                time.sleep(max(0.0, began + (n + 1) * self.seconds / self.runs - time.monotonic()))
        finally:
            publisher.close()

    def finish(self, timeout: float = 120) -> None:
        self.join(timeout)
        assert not self.is_alive(), "the load did not finish publishing"
        assert not self.unconfirmed, f"submissions never confirmed: {self.unconfirmed}"


@dataclass
class UnderLoad:
    """A test's roles at work on a load: the test marks when its fault began."""

    app: App
    load: Load
    engine: Engine
    agents: list[AgentWorker]
    fault_at: float | None = None

    def fault(self) -> None:
        """The fault begins now."""
        self.fault_at = time.time()

    def gap(self) -> Gap:
        assert self.fault_at is not None, "no fault was marked"
        return gap(completions(self.engine), self.fault_at)

    def summary(self) -> str:
        steps = 2 * len(self.load.confirmed)
        return f"{self.gap().text()}; {self.app.ledger.executions()} executions for {steps} steps"


@contextlib.contextmanager
def under_load(
    names: Names,
    *,
    broker_url: str,
    database_url: str,
    engine: Engine,
    runs: int = 40,
    seconds: float = 8,
    settle: float = 90,
    agents: int = 2,
) -> Iterator[UnderLoad]:
    """The roles at work on `runs` runs submitted over `seconds`; the block runs once steps
    complete (the test's fault), then every confirmed submission must end as one completed
    run within `settle` seconds, every step executed and its completion applied once."""
    app = make_app()
    load = Load(broker_url, names, runs=runs, seconds=seconds)
    with roles(
        app, names, broker_url=broker_url, database_url=database_url, engine=engine, agents=agents
    ) as workers:
        load.start()
        harness.wait_for(
            lambda: len(completions(engine)) >= min(10, runs), timeout=30, what="work flowing"
        )
        scenario = UnderLoad(app, load, engine, workers)
        yield scenario
        load.finish()
        harness.wait_for(
            lambda: (
                len(states := run_states(engine)) == len(load.confirmed)
                and set(states.values()) == {"completed"}
            ),
            timeout=settle,
            what="every run completed",
            interval=0.5,
        )
    assert sorted(run_states(engine)) == sorted(load.confirmed)
    assert processed_twice(engine) == []
    assert app.ledger.executions() >= 2 * len(load.confirmed)


def run_states(engine: Engine) -> dict[str, str]:
    """Business key -> state of every run."""
    with engine.connect() as conn:
        return dict(conn.execute(select(runs.c.business_key, runs.c.state)).all())


def completions(engine: Engine) -> list[float]:
    """When each step was processed (epoch seconds, database clock), in order."""
    with engine.connect() as conn:
        found = conn.execute(
            select(func.extract("epoch", events.c.created_at))
            .where(events.c.entity == "step", events.c.to_state == "processed")
            .order_by(events.c.created_at)
        ).scalars()
        return [float(value) for value in found]


def processed_twice(engine: Engine) -> list[int]:
    """Steps with more than one `processed` event (a completion applied twice)."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(events.c.step_id)
                .where(events.c.entity == "step", events.c.to_state == "processed")
                .group_by(events.c.step_id)
                .having(func.count() > 1)
            ).scalars()
        )


def step_attempts(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(steps.c.id, steps.c.attempt)).all())


@dataclass(frozen=True)
class Gap:
    """How a fault at `at` (epoch seconds) showed in the step completions."""

    next_done: float | None
    """Seconds from the fault to the first step processed after it."""
    longest: float
    """The longest pause between two completions from 5 s before the fault to the end."""

    def text(self) -> str:
        done = "never" if self.next_done is None else f"{self.next_done:.2f}s"
        return f"next step done {done} after the fault, longest pause {self.longest:.2f}s"


def gap(times: list[float], at: float) -> Gap:
    after = [t for t in times if t >= at]
    window = [t for t in times if t >= at - 5]
    pauses = [b - a for a, b in itertools.pairwise(window)]
    return Gap(after[0] - at if after else None, max(pauses, default=0.0))
