"""The engine's contract, checked on every store/transport pair: SQLite + in-process bus (the
embedded default), PostgreSQL + RabbitMQ (production), and the two mixed pairs.

Each test runs the real roles (submitter, schedulers, agents, supervisor) as threads; only
the store URL and the transport differ. A difference in outcome between pairs is a bug in
the implementation that differs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow import Backoff, Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.messages import Reply, Submission
from sasflow.store.db import make_engine
from sasflow.store.schema import alerts, events, runs, steps
from sasflow.transport.memory import MemoryBroker
from sasflow.transport.topology import REASON_HEADER, Names
from tests import harness, services
from tests.apps import basic
from tests.apps.travel import travel
from tests.contract.stack import PAIRS, Observer, Stack, sqlite_copy, sqlite_template

pytestmark = [pytest.mark.contract, pytest.mark.integration]


@pytest.fixture(scope="session")
def sqlite_template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(tmp_path_factory.mktemp("sqlite-template"))


AGENTS = ["echo", "slow", "booking"]


def _delete_on_rabbitmq(names: Names) -> None:
    """Delete the test's queues and exchanges by name (quicker than listing with rabbitmqctl);
    the contract tests use only these."""
    queues = [*names.all_queues(AGENTS), f"{names.namespace}.contract-status"]
    exchanges = [
        names.status,
        names.alerts,
        names.dead_letter_exchange,
        names.fleet,
        *(names.breakers(a) for a in AGENTS),
    ]
    with services.broker_channel() as channel:
        for queue in queues:
            channel.queue_delete(queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange)


@pytest.fixture(params=PAIRS, ids=[f"{store}+{bus}" for store, bus in PAIRS])
def stack(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template_file: Path
) -> Iterator[Stack]:
    store, bus = request.param
    if store == "sqlite":
        database_url = sqlite_copy(sqlite_template_file, tmp_path)
    else:
        database_url = request.getfixturevalue("database_url")
    engine = make_engine(database_url, application_name="sasflow-contract")
    broker = MemoryBroker() if bus == "memory" else None
    broker_url = "memory://" if bus == "memory" else services.broker_url()
    names = Names(services.unique("sfcontract"))
    try:
        yield Stack(
            store=store,
            bus=bus,
            database_url=database_url,
            engine=engine,
            names=names,
            broker_url=broker_url,
            broker=broker,
        )
    finally:
        engine.dispose()
        if bus == "rabbitmq":
            _delete_on_rabbitmq(names)


@pytest.fixture
def observer(stack: Stack) -> Iterator[Observer]:
    observer = Observer(stack)
    yield observer
    observer.close()


def _states(engine: Engine) -> dict[int, str]:
    return harness.run_states(engine)


def test_submissions_on_the_bus_become_one_run_per_key_that_completes_and_is_announced(
    stack: Stack, observer: Observer
) -> None:
    """Submissions (one sent twice) go through the submitter; runs complete with outputs; the
    status exchange announces each completion."""
    names = stack.names
    status_queue = f"{names.namespace}.contract-status"
    observer.declare_bound_queue(status_queue, names.status, "pipeline.run.*")
    with harness.running(
        stack.submitter(basic.registry), stack.scheduler(basic.registry), stack.agent(basic.echo)
    ):
        for key, text in [("k1", "hello"), ("k2", "sasflow"), ("k1", "hello")]:
            body = Submission(workflow="pipeline", key=key, input={"text": text}).encode()
            observer.publish(names.submit, body)
        harness.wait_for(
            harness.all_runs_in(stack.engine, {"completed"}, 2),
            what=f"two runs complete on {stack.label}",
        )
        announced = observer.take(
            status_queue, lambda found: sum(m.get("state") == "completed" for m in found) >= 2
        )
    with stack.engine.connect() as conn:
        outputs = dict(conn.execute(select(runs.c.business_key, runs.c.output)).all())
    assert outputs == {"k1": {"b": {"length": 5}}, "k2": {"b": {"length": 7}}}
    completed = sorted(m["key"] for m in announced if m.get("state") == "completed")
    assert completed == ["k1", "k2"]


def test_two_schedulers_dispatch_every_step_exactly_once(stack: Stack) -> None:
    """120 two-step runs drained by two schedulers: every step completes on attempt 1, and
    the schedulers' claims add up to the steps (none claimed twice)."""
    with stack.engine.begin() as conn:
        for index in range(120):
            submit_run(
                conn,
                basic.registry,
                "pipeline",
                {"text": f"t{index}"},
                key=f"run-{index}",
                namespace=stack.names.namespace,
            )
    first = stack.scheduler(basic.registry, claim_batch=10)
    second = stack.scheduler(basic.registry, claim_batch=10)
    with harness.running(first, second, stack.agent(basic.echo, concurrency=8)):
        harness.wait_for(
            harness.all_runs_in(stack.engine, {"completed"}, 120),
            timeout=60,
            what=f"120 runs complete on {stack.label}",
        )
    rows = harness.step_rows(stack.engine)
    assert len(rows) == 240
    assert {(r.state, r.attempt, r.failure_count) for r in rows} == {("processed", 1, 0)}
    assert first.stats.claimed + second.stats.claimed == 240


def _stuck_once() -> tuple[Registry, Agent, list[tuple[int, str]]]:
    """An agent whose first call outlives the step's deadline (so it goes silent)."""
    calls: list[tuple[int, str]] = []
    lock = threading.Lock()
    slow = Agent("slow")

    @slow.handler("work")
    def work(call: Call) -> dict[str, Any]:
        with lock:
            calls.append((call.attempt, call.idempotency_key))
            first = len(calls) == 1
        if first:
            threading.Event().wait(2.5)  # past the 1 s deadline: the agent stays silent
        return {"attempt": call.attempt}

    policy = StepPolicy(timeout=1, max_failures=3, backoff=Backoff(initial=0.1, maximum=0.5))
    flow = Workflow("stuck", [Step("only", "slow", "work", policy=policy)])
    return Registry([flow], [slow]), slow, calls


def test_an_expired_step_is_recovered_by_the_supervisor_and_a_late_reply_is_fenced(
    stack: Stack, observer: Observer
) -> None:
    """The first attempt outlives its deadline; the supervisor counts one failure and makes
    the step pending; attempt 2 completes with the same idempotency key. A reply of the
    superseded attempt 1, arriving afterwards, changes nothing."""
    registry, slow, calls = _stuck_once()
    with stack.engine.begin() as conn:
        run = submit_run(
            conn, registry, "stuck", {}, key="stuck-1", namespace=stack.names.namespace
        )
    scheduler = stack.scheduler(registry)
    with harness.running(scheduler, stack.agent(slow), stack.supervisor(interval=0.2, lease_ttl=5)):
        harness.wait_for(
            lambda: _states(stack.engine).get(run.run_id) == "completed",
            timeout=20,
            what=f"recovery on {stack.label}",
        )
        (step,) = harness.step_rows(stack.engine, run.run_id)
        late = Reply(step_id=step.id, attempt=1, status="ok", output={"attempt": 1})
        observer.publish(stack.names.replies, late.encode(), correlation_id=f"{step.id}:1")
        harness.wait_for(
            lambda: scheduler.stats.dropped >= 1,
            timeout=10,
            what="the late reply reaches the scheduler and is dropped",
        )
    (step,) = harness.step_rows(stack.engine, run.run_id)
    assert (step.state, step.attempt, step.failure_count) == ("processed", 2, 1)
    assert step.output == {"attempt": 2}
    assert [attempt for attempt, _ in calls] == [1, 2]
    assert len({key for _, key in calls}) == 1


def test_a_permanent_failure_compensates_the_done_steps_in_reverse_order(stack: Stack) -> None:
    """Book a flight and a hotel; the car fails for good; hotel then flight are cancelled."""
    registry, calls, _ = travel()
    booking = registry.agent("booking")
    assert isinstance(booking, Agent)
    with stack.engine.begin() as conn:
        run = submit_run(
            conn, registry, "trip", {"who": "ada"}, key="trip-1", namespace=stack.names.namespace
        )
    with harness.running(stack.scheduler(registry), stack.agent(booking)):
        harness.wait_for(
            lambda: _states(stack.engine).get(run.run_id) == "compensated",
            timeout=20,
            what=f"compensation on {stack.label}",
        )
    assert [c[0] for c in calls] == ["book", "book", "book", "cancel", "cancel"]
    undone = [c[1]["output"]["reference"].split("-")[0] for c in calls if c[0] == "cancel"]
    assert undone == ["hotel", "flight"]


def test_a_request_nobody_takes_expires_uncharged_and_the_step_completes_when_the_agent_comes(
    stack: Stack,
) -> None:
    """With no agent running, each request expires in the agent's queue after the step's wait
    timeout; the broker (or bus) dead-letters it and the supervisor makes the step pending
    again without counting a failure (the wait clock), so the run outlives an absence longer
    than max_failures timeouts; once the agent comes, the step completes."""
    slow = Agent("slow")
    slow.add_handler("work", lambda call: {"attempt": call.attempt})
    policy = StepPolicy(timeout=2, max_failures=1, wait_timeout=0.3)
    flow = Workflow("stuck", [Step("only", "slow", "work", policy=policy)])
    registry = Registry([flow], [slow])
    with stack.engine.begin() as conn:
        run = submit_run(
            conn, registry, "stuck", {}, key="nobody-1", namespace=stack.names.namespace
        )

    def wait_expiries() -> int:
        return int(harness.step_rows(stack.engine)[0].wait_expiries)

    with harness.running(stack.scheduler(registry), stack.supervisor(interval=0.2)):
        harness.wait_for(
            lambda: wait_expiries() >= 3,
            timeout=20,
            what=f"three wait expiries on {stack.label}",
        )
    (absent,) = harness.step_rows(stack.engine)
    assert (absent.failure_count, absent.error["type"]) == (0, "WaitTimeout")
    assert _states(stack.engine)[run.run_id] == "running"
    with harness.running(
        stack.scheduler(registry), stack.agent(slow), stack.supervisor(interval=0.2)
    ):
        harness.wait_for(
            lambda: _states(stack.engine).get(run.run_id) == "completed",
            timeout=20,
            what=f"the run completes once the agent runs on {stack.label}",
        )
    (done,) = harness.step_rows(stack.engine)
    assert (done.state, done.failure_count) == ("processed", 0)
    with stack.engine.connect() as conn:
        reasons = (
            conn.execute(
                select(events.c.reason).where(
                    events.c.run_id == run.run_id,
                    events.c.entity == "step",
                    events.c.to_state == "pending",
                )
            )
            .scalars()
            .all()
        )
        raised = conn.execute(select(alerts.c.kind)).scalars().all()
    assert set(reasons) == {"wait expired"}
    assert len(reasons) >= 3
    assert raised == []


def test_progress_messages_travel_and_a_heartbeating_step_outlives_its_heartbeat_timeout(
    stack: Stack,
) -> None:
    """`step.started` and `step.heartbeat` go from the agent over the bus to the scheduler, which
    applies them: a 1.5 s handler under a 0.5 s heartbeat clock completes, uncharged, its
    `started` recorded once."""
    slow = Agent("slow")

    @slow.handler("work")
    def work(call: Call) -> dict[str, int]:
        until = threading.Event()
        for _ in range(30):
            call.heartbeat()
            until.wait(0.05)
        return {"attempt": call.attempt}

    policy = StepPolicy(timeout=20, heartbeat_timeout=0.5, max_failures=1)
    registry = Registry([Workflow("beat", [Step("only", "slow", "work", policy=policy)])], [slow])
    with stack.engine.begin() as conn:
        run = submit_run(conn, registry, "beat", {}, key="beat-1", namespace=stack.names.namespace)
    scheduler, agent = stack.scheduler(registry), stack.agent(slow)
    with harness.running(scheduler, agent, stack.supervisor(interval=0.1)):
        harness.wait_for(
            lambda: _states(stack.engine).get(run.run_id) == "completed",
            timeout=20,
            what=f"the heartbeating run completes on {stack.label}",
        )
    (step,) = harness.step_rows(stack.engine)
    assert (step.failure_count, step.attempt) == (0, 1)
    assert (agent.stats.started, scheduler.stats.started) == (1, 1)
    assert agent.stats.heartbeats >= 3
    assert scheduler.stats.heartbeats >= 3
    with stack.engine.connect() as conn:
        reasons = (
            conn.execute(select(events.c.reason).where(events.c.step_id == step.id)).scalars().all()
        )
    assert reasons == [None, "started", None]


def test_a_poison_request_is_dead_lettered_with_a_reason(stack: Stack, observer: Observer) -> None:
    """Garbage on an agent's queue is dead-lettered with the reason; the agent goes on."""
    names = stack.names
    with harness.running(stack.scheduler(basic.registry), stack.agent(basic.echo)):
        harness.wait_for(lambda: _agent_queue_ready(observer, names), what="agent ready")
        observer.publish(names.agent("echo"), b"\x00not json")
        dead = observer.take(names.dead_letter_queue, lambda found: len(found) >= 1)
        with stack.engine.begin() as conn:
            run = submit_run(
                conn,
                basic.registry,
                "pipeline",
                {"text": "ok"},
                key="after",
                namespace=names.namespace,
            )
        harness.wait_for(
            lambda: _states(stack.engine).get(run.run_id) == "completed",
            what=f"the agent still serves on {stack.label}",
        )
    assert len(dead) == 1
    assert dead[0]["_headers"].get(REASON_HEADER)


def _agent_queue_ready(observer: Observer, names: Names) -> bool:
    try:
        observer.take(names.agent("echo"), lambda _found: True, timeout=0)
    except Exception:  # noqa: BLE001 - not declared yet on this transport
        return False
    return True


def test_the_step_rows_agree_across_pairs(stack: Stack) -> None:
    """A diamond DAG: the fan-in step runs after both branches, with their outputs."""
    with stack.engine.begin() as conn:
        run = submit_run(
            conn,
            basic.registry,
            "diamond",
            {"text": "hi"},
            key="dag",
            namespace=stack.names.namespace,
        )
    with harness.running(stack.scheduler(basic.registry), stack.agent(basic.echo)):
        harness.wait_for(
            lambda: _states(stack.engine).get(run.run_id) == "completed",
            what=f"the DAG completes on {stack.label}",
        )
    rows = {r.name: r for r in harness.step_rows(stack.engine, run.run_id)}
    assert rows["end"].output == {"joined": "HI-2"}
    assert rows["end"].dispatched_at >= max(rows["left"].updated_at, rows["right"].updated_at)
    with stack.engine.connect() as conn:
        assert conn.execute(select(steps.c.state).distinct()).scalars().all() == ["processed"]
