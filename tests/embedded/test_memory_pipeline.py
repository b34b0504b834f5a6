"""The real roles as threads over one MemoryBroker, with the real PostgreSQL store (the mixed
pair: the embedded default's in-process bus and the production state store) and, for the
pipeline, with SQLite too (the whole embedded default)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call
from sasflow.agents.worker import AgentWorker
from sasflow.errors import ConfigurationError
from sasflow.messages import Submission
from sasflow.scheduler import Scheduler, SchedulerOptions
from sasflow.store.schema import runs
from sasflow.submitter import Submitter
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.base import Delivery, Outgoing
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.topology import Names, declare_common
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration


@pytest.fixture
def names() -> Names:
    """A namespace of its own: the scheduler's PostgreSQL notifications are named after it."""
    return Names(services.unique("sfmem"))


@pytest.fixture
def app(broker: MemoryBroker, names: Names) -> Iterator[MemoryTransport]:
    """The submitting application's connection, owned by the test thread."""
    transport = MemoryTransport(broker, process_name="app")
    transport.connect()
    declare_common(transport, names)
    yield transport
    transport.close()


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture(params=["postgresql", "sqlite"])
def store(request: pytest.FixtureRequest) -> tuple[Engine, str]:
    """The state store's engine and URL: PostgreSQL (the mixed pair) or SQLite (the whole
    embedded default)."""
    if request.param == "postgresql":
        return request.getfixturevalue("engine"), request.getfixturevalue("database_url")
    return request.getfixturevalue("sqlite_engine"), request.getfixturevalue("sqlite_url")


def collect(
    transport: MemoryTransport, queue: str, *, until: str, timeout: float = 20.0
) -> list[Delivery]:
    """Take (and ack) `queue`'s messages until one has the routing-key-like `until` state."""
    found: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivery = transport.get(queue)
        if delivery is None:
            time.sleep(0.02)
            continue
        transport.ack(delivery)
        found.append(delivery)
        event = json.loads(delivery.body)
        if f"{event['workflow']}.{event['entity']}.{event['state']}" == until:
            return found
    raise AssertionError(f"no {until} event in {queue} within {timeout}s: {found!r}")


def test_submitted_pipeline_completes_over_the_in_process_bus(
    store: tuple[Engine, str],
    names: Names,
    broker: MemoryBroker,
    app: MemoryTransport,
) -> None:
    """Submitter, scheduler, agent and supervisor threads on one MemoryBroker run a submission
    to completion, and the application sees the status notifications on its bound queue."""
    engine, database_url = store
    status = f"{names.namespace}.app-status"
    app.declare_queue(status, dead_letter_exchange=None)
    app.bind_queue(status, names.status, "pipeline.run.*")

    def transport(role: str) -> MemoryTransport:
        return MemoryTransport(broker, process_name=f"sasflow-{role}")

    roles = (
        Submitter(engine, transport("submitter"), basic.registry, names),
        Scheduler(
            engine,
            transport("scheduler"),
            basic.registry,
            names,
            database_url=database_url,
            options=SchedulerOptions(rescan_interval=0.2),
        ),
        AgentWorker(basic.echo, transport("agent-echo"), names, concurrency=2),
        Supervisor(
            engine,
            names,
            transport=transport("supervisor"),
            options=SupervisorOptions(interval=0.2),
        ),
    )
    submission = Submission(workflow="pipeline", input={"text": "hello"}, key="mem-1")
    app.publish(Outgoing("", names.submit, submission.encode(), mandatory=True))
    with harness.running(*roles):
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")
        events = collect(app, status, until="pipeline.run.completed")

    with engine.connect() as conn:
        output = conn.execute(select(runs.c.output).where(runs.c.business_key == "mem-1")).one()
    assert output[0] == {"b": {"length": 5}}
    bodies = [json.loads(d.body) for d in events]
    assert [b["state"] for b in bodies] == ["pending", "running", "completed"]
    assert {(d.headers["key"], d.headers["run_id"]) for d in events} == {
        ("mem-1", bodies[0]["run_id"])
    }
    assert broker.depth(names.dead_letter_queue) == 0


nobody = Agent("nobody")  # registered, but no worker serves it in this test


@nobody.handler("anything")
def anything(call: Call) -> None:
    raise AssertionError("no worker runs this agent")


absent = Workflow(
    "absent",
    [
        Step("call", "nobody", "anything", policy=StepPolicy(timeout=60, max_failures=1)),
    ],
)


def test_supervisor_returns_a_request_the_bus_expired_uncharged(
    engine: Engine,
    database_url: str,
    names: Names,
    broker: MemoryBroker,
    app: MemoryTransport,
) -> None:
    """A request that expired in the agent's queue is dead-lettered with `x-death`; the
    supervisor reads it from <ns>.dead.requests and, before its deadline, makes the step
    pending again without counting a failure (the wait clock: no agent took it)."""
    registry = Registry([absent], [nobody])
    scheduler = Scheduler(
        engine,
        MemoryTransport(broker, process_name="sasflow-scheduler"),
        registry,
        names,
        database_url=database_url,
        options=SchedulerOptions(rescan_interval=0.2),
    )
    supervisor = Supervisor(
        engine,
        names,
        transport=MemoryTransport(broker, process_name="sasflow-supervisor"),
        options=SupervisorOptions(interval=0.2),
    )
    queue = names.agent("nobody")
    submission = Submission(workflow="absent", input={}, key="lost-1")
    app.publish(Outgoing("", names.submit, submission.encode(), mandatory=True))
    submitter = Submitter(
        engine, MemoryTransport(broker, process_name="sasflow-submitter"), registry, names
    )
    with harness.running(submitter, scheduler, supervisor):
        harness.wait_for(lambda: dispatched(broker, queue), what="the request is dispatched")
        # The 60 s budget is too long to wait for: expire this very request at once instead,
        # as the broker would have (same body, correlation id and reply_to).
        request = app.get(queue)
        assert request is not None
        app.publish(
            Outgoing(
                "",
                queue,
                request.body,
                expiration_ms=1,
                correlation_id=request.correlation_id,
                reply_to=request.reply_to,
            )
        )
        app.ack(request)
        harness.wait_for(
            lambda: harness.step_rows(engine)[0].attempt == 2, what="the step is dispatched again"
        )

    (step,) = harness.step_rows(engine)
    assert (step.failure_count, step.wait_expiries, step.error) == (
        0,
        1,
        {"type": "WaitTimeout", "message": "wait clock: no agent took the request within 0.001 s"},
    )
    operators_copy = app.get(names.dead_letter_queue)
    assert operators_copy is not None
    assert operators_copy.headers["x-first-death-reason"] == "expired"


def dispatched(broker: MemoryBroker, queue: str) -> bool:
    try:
        return broker.depth(queue) == 1
    except ConfigurationError:  # not declared yet: the scheduler declares it before dispatching
        return False


def test_roles_reconnect_after_a_bus_outage_and_finish_the_work(
    engine: Engine,
    database_url: str,
    names: Names,
    broker: MemoryBroker,
    app: MemoryTransport,
) -> None:
    """`disconnect_all` drops every connection mid-run (unacked messages go back to their
    queues); the roles reconnect on their own and every run still completes."""

    def transport(role: str) -> MemoryTransport:
        return MemoryTransport(broker, process_name=f"sasflow-{role}")

    roles = (
        Submitter(engine, transport("submitter"), basic.registry, names),
        Scheduler(
            engine,
            transport("scheduler"),
            basic.registry,
            names,
            database_url=database_url,
            options=SchedulerOptions(rescan_interval=0.2),
        ),
        AgentWorker(basic.echo, transport("agent-echo"), names, concurrency=2),
    )
    total = 20  # two steps of 0.1 s each on two agent threads: about 2 s of work
    app.publish_many(
        [
            Outgoing(
                "",
                names.submit,
                Submission(workflow="sleepy", input={"delay": 0.1}, key=f"k{i}").encode(),
                mandatory=True,
            )
            for i in range(total)
        ]
    )
    with harness.running(*roles):
        harness.wait_for(
            lambda: "completed" in harness.run_states(engine).values(), what="a first run completes"
        )
        broker.disconnect_all(stay_down=True)
        finished = list(harness.run_states(engine).values()).count("completed")
        time.sleep(0.3)  # the roles fail to reconnect for a while
        broker.restore()
        harness.wait_for(
            harness.all_runs_in(engine, {"completed"}, total),
            what="every run completes after the outage",
        )
    assert finished < total, "the outage came too late to interrupt anything"
    app.connect()  # the outage dropped the application's connection too
    assert app.get(names.dead_letter_queue) is None
