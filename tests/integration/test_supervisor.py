"""The supervisor: expired steps retried with growing backoff then escalated once, leases,
concurrent sweeps that never count twice, stalled work, dead-lettered requests."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from sqlalchemy import Engine, func, select, text, update

from sasflow import Backoff, Registry, Step, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.errors import LeaseLostError
from sasflow.states import RunState, StepState
from sasflow.store.cluster.lease import SUPERVISOR_LEASE, Lease
from sasflow.store.db import transaction
from sasflow.store.runs import queries, sweeps
from sasflow.store.runs.sweeps import SweepReport
from sasflow.store.schema import alerts, events, runs, steps
from sasflow.supervisor.dispatch import AlertDispatcher
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.supervisor.sinks import LogSink, WebhookSink
from sasflow.supervisor.sweep import sweep_expired
from sasflow.transport.topology import REASON_HEADER, Names
from tests import harness, services
from tests.apps import basic
from tests.integration.webhook import bodies, url_of, webhook_server

pytestmark = pytest.mark.integration


class Supervisors:
    """Supervisors made by a test, their broker connections closed at its end."""

    def __init__(self, engine: Engine, names: Names) -> None:
        self.engine, self.names, self.made = engine, names, list[Supervisor]()

    def __call__(self, dispatcher: AlertDispatcher | None = None, **options: Any) -> Supervisor:
        role = Supervisor(
            self.engine,
            self.names,
            transport=harness.transport("supervisor"),
            dispatcher=dispatcher,
            options=SupervisorOptions(**options),
        )
        self.made.append(role)
        return role


@pytest.fixture
def supervisors(engine: Engine, names: Names) -> Iterator[Supervisors]:
    made = Supervisors(engine, names)
    yield made
    for role in made.made:
        role.close()


def test_a_step_that_always_times_out_backs_off_longer_each_time_then_errors_with_one_alert(
    engine: Engine, database_url: str, names: Names, supervisors: Supervisors
) -> None:
    """Each expiry is retried after a longer backoff; at the threshold the step and run go to
    error and exactly one alert is raised, which reaches a webhook."""
    silent = Agent("silent")
    started: list[float] = []

    @silent.handler("hang")
    def hang(call: Call) -> None:
        started.append(time.monotonic())
        time.sleep(call.remaining() + 0.2)  # never answers in time

    policy = StepPolicy(
        timeout=0.4, max_failures=3, backoff=Backoff(initial=0.3, multiplier=3, maximum=10)
    )
    registry = Registry(
        [Workflow("stuck", [Step("only", "silent", "hang", policy=policy)])], [silent]
    )
    with engine.begin() as conn:
        run = submit_run(conn, registry, "stuck", {}, key="k", namespace=names.namespace)
    with webhook_server() as hook:
        dispatcher = AlertDispatcher(
            engine, [LogSink(), WebhookSink(url_of(hook))], namespace=names.namespace
        )
        with harness.running(
            harness.scheduler(engine, database_url, registry, names, rescan_interval=0.1),
            harness.agent(silent, names),
            supervisors(dispatcher=dispatcher, interval=0.1),
        ):
            harness.wait_for(
                lambda: harness.run_states(engine) == {run.run_id: RunState.ERROR},
                timeout=30,
                what="run errors after 3 expiries",
            )
            harness.wait_for(lambda: len(hook.requests) >= 1, what="the webhook is called")
            time.sleep(0.5)  # a second (duplicate) delivery would arrive by now
        received = bodies(hook)
    assert len(started) == 3
    gaps = [b - a for a, b in itertools.pairwise(started)]
    # attempt n+1 starts after the deadline (0.4 s) plus backoff 0.3 s, then 0.9 s
    assert gaps[0] > 0.4 + 0.3
    assert gaps[1] > 0.4 + 0.9
    assert gaps[1] > gaps[0] + 0.4, f"backoff did not grow: {gaps}"
    (step,) = harness.step_rows(engine)
    assert (step.state, step.failure_count, step.attempt) == (StepState.ERROR, 3, 3)
    assert step.error == {
        "type": "ExecutionTimeout",
        "message": "execution clock: no reply within the step's timeout of 0.4 s after the "
        "agent started it",
    }
    with engine.connect() as conn:
        raised = conn.execute(select(alerts.c.kind, alerts.c.step_id, alerts.c.run_id)).all()
    assert [tuple(a) for a in raised] == [("step_failed", step.id, run.run_id)]
    assert [(b["kind"], b["step_id"], b["run_id"]) for b in received] == [
        ("step_failed", step.id, run.run_id)
    ]


def _expired_steps(engine: Engine, count: int) -> list[int]:
    """`count` one-step runs whose step is processing with a deadline in the past."""
    with engine.begin() as conn:
        for i in range(count):
            submit_run(conn, basic.registry, "pipeline", {"text": "x"}, key=f"e{i}", namespace="t")
        conn.execute(
            update(steps)
            .where(steps.c.name == "a")
            .values(
                state=StepState.PROCESSING,
                attempt=1,
                locked_by="gone",
                started_at=func.now() - text("interval '2 minutes'"),
                complete_by=func.now() - text("interval '1 minute'"),
            )
        )
        return list(conn.execute(select(steps.c.id).where(steps.c.name == "a")).scalars())


def test_two_supervisors_sweeping_500_expired_steps_count_each_failure_exactly_once(
    engine: Engine,
    names: Names,
    supervisors: Supervisors,
) -> None:
    """Both at the level of the lease (two supervisors racing sweep_once) and of the statement
    itself (two sweepers that both believe they lead, with small batches and SKIP LOCKED)."""
    ids = _expired_steps(engine, 500)
    first, second = supervisors(batch=50), supervisors(batch=50)
    barrier = threading.Barrier(2)
    reports: list[SweepReport | None] = []

    def sweep(role: Supervisor) -> None:
        barrier.wait()
        reports.append(role.sweep_once())

    threads = [threading.Thread(target=sweep, args=(r,)) for r in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    acted = [r for r in reports if r is not None]
    assert len(acted) == 1, "both supervisors acted at once"
    assert acted[0].reclaimed == 500
    with engine.connect() as conn:
        counts = dict(
            conn.execute(select(steps.c.id, steps.c.failure_count).where(steps.c.id.in_(ids))).all()
        )
    assert set(counts.values()) == {1}

    # The statement alone: make them expired again and sweep from two threads in parallel.
    with engine.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.id.in_(ids))
            .values(
                state=StepState.PROCESSING,
                started_at=func.now() - text("interval '2 minutes'"),
                complete_by=func.now() - text("interval '1 minute'"),
            )
        )
    swept: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def raw_sweep() -> None:
        barrier.wait()
        while True:
            with transaction(engine) as conn:
                candidates = sorted(
                    set(conn.execute(queries.expired_runs(), {"b_batch": 20}).scalars())
                )
                if not candidates:
                    return
                locked = (
                    conn.execute(queries.lock_runs(skip_locked=True), {"b_run_ids": candidates})
                    .scalars()
                    .all()
                )
                expired = [r.id for r in sweeps.take_expired(conn, locked)]
                rows = sweeps.count_failures(conn, expired, error=None)
            with lock:
                swept.extend(r.id for r in rows)

    threads = [threading.Thread(target=raw_sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(swept) == sorted(ids)
    with engine.connect() as conn:
        counts = dict(
            conn.execute(select(steps.c.id, steps.c.failure_count).where(steps.c.id.in_(ids))).all()
        )
    assert set(counts.values()) == {2}


def test_a_paused_leader_is_replaced_and_cannot_act_after_losing_its_lease(
    engine: Engine,
) -> None:
    paused, standby = (
        Lease("paused", name=SUPERVISOR_LEASE, ttl=1.0),
        Lease("standby", name=SUPERVISOR_LEASE, ttl=1.0),
    )
    assert paused.acquire(engine)
    first_token = paused.token
    assert not standby.acquire(engine)
    time.sleep(1.2)  # the leader was paused (SIGSTOP, GC, VM migration) past its lease
    assert standby.acquire(engine)
    assert standby.token == (first_token or 0) + 1
    report = SweepReport()
    with pytest.raises(LeaseLostError):
        sweep_expired(
            engine, paused, batch=10, budget=1, actor="paused", report=report, namespace="t"
        )
    assert paused.token is None


def test_ready_steps_nobody_claims_raise_one_stalled_alert_per_agent(
    engine: Engine,
    names: Names,
    supervisors: Supervisors,
) -> None:
    with engine.begin() as conn:
        for i in range(3):
            submit_run(
                conn,
                basic.registry,
                "pipeline",
                {"text": "x"},
                key=f"s{i}",
                namespace=names.namespace,
            )
        conn.execute(
            update(steps)
            .where(steps.c.state == StepState.PENDING)
            .values(not_before=func.now() - text("interval '10 minutes'"))
        )
    role = supervisors(stalled_after=60)
    first, second = role.sweep_once(), role.sweep_once()
    assert first is not None
    assert second is not None
    assert len(first.alerts) == 2  # stalled, and agent_outage: nothing consumes echo's queue
    assert second.alerts == []  # deduplicated while the first is open
    with engine.connect() as conn:
        alert = conn.execute(select(alerts).where(alerts.c.kind == "stalled")).one()
        kinds = sorted(conn.execute(select(alerts.c.kind)).scalars())
    assert (alert.kind, alert.detail["agent"], alert.detail["steps"]) == ("stalled", "echo", 3)
    assert kinds == ["agent_outage", "stalled"]


def test_a_dead_lettered_request_counts_as_a_failure_before_its_deadline(
    engine: Engine,
    names: Names,
    supervisors: Supervisors,
) -> None:
    """An agent that dead-letters a request proves the attempt will never reply: the failure
    is counted at the next sweep rather than when the (long) deadline passes."""
    with engine.begin() as conn:
        submit_run(
            conn, basic.registry, "pipeline", {"text": "x"}, key="d", namespace=names.namespace
        )
        conn.execute(
            update(steps)
            .where(steps.c.name == "a")
            .values(
                state=StepState.PROCESSING,
                attempt=1,
                locked_by="s",
                complete_by=func.now() + text("interval '1 hour'"),
            )
        )
        step_id = conn.execute(select(steps.c.id).where(steps.c.name == "a")).scalar_one()
    role = supervisors()
    assert role.sweep_once() is not None  # declares the dead-letter topology
    body = b'{"step_id": %d, "attempt": 1, "agent": "echo", "broken": true}' % step_id
    with services.broker_channel() as channel:
        channel.confirm_delivery()
        channel.basic_publish(
            names.dead_letter_exchange,
            names.agent("echo"),
            body,
            pika.BasicProperties(headers={REASON_HEADER: "Request: budget_ms: missing"}),
        )
    report = role.sweep_once()
    assert report is not None
    assert report.dead_requests == 1
    (row,) = [r for r in harness.step_rows(engine) if r.id == step_id]
    assert (row.state, row.failure_count) == (StepState.PENDING, 1)
    assert row.error == {"type": "RequestDeadLettered", "message": "Request: budget_ms: missing"}
    assert harness.dead_letters(names, 1)[0]["body"] == body  # the operator's copy stays


def test_events_record_each_expiry_with_the_backoff(
    engine: Engine, supervisors: Supervisors
) -> None:
    (step_id,) = _expired_steps(engine, 1)
    report = supervisors().sweep_once()
    assert report is not None
    assert report.reclaimed == 1
    with engine.connect() as conn:
        event = conn.execute(
            select(events).where(events.c.step_id == step_id, events.c.reason == "expired")
        ).one()
        run = conn.execute(select(runs.c.state)).scalar_one()
    assert (event.from_state, event.to_state, event.attempt) == (
        StepState.PROCESSING,
        StepState.PENDING,
        1,
    )
    assert event.detail["failure_count"] == 1
    assert run == RunState.PENDING


def test_expired_steps_sharing_runs_are_all_swept_across_batches(
    engine: Engine, supervisors: Supervisors
) -> None:
    """Both steps of each run expired, swept in batches smaller than their number."""
    with engine.begin() as conn:
        for i in range(30):
            submit_run(conn, basic.registry, "diamond", {"text": "x"}, key=f"d{i}", namespace="t")
        conn.execute(
            update(steps)
            .where(steps.c.name.in_(("left", "right")))
            .values(
                state=StepState.PROCESSING,
                attempt=1,
                locked_by="gone",
                started_at=func.now() - text("interval '2 minutes'"),
                complete_by=func.now() - text("interval '1 minute'"),
            )
        )
    report = supervisors(batch=7).sweep_once()
    assert report is not None
    assert report.reclaimed == 60
    assert report.complete
