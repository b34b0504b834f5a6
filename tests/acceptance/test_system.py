"""The whole pipeline as operators run it: submitter, two schedulers and agents as processes."""

from __future__ import annotations

import json
import signal
import time
import uuid

import pika
import pytest
from sqlalchemy import Engine, func, select

from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import Processes

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

RUNS = 1000


def _publish_submissions(names: Names, count: int, workflow: str = "pipeline") -> None:
    with services.broker_channel() as channel:
        channel.confirm_delivery()
        channel.queue_declare(
            names.submit,
            durable=True,
            arguments={"x-dead-letter-exchange": names.dead_letter_exchange},
        )
        for i in range(count):
            body = json.dumps(
                {"workflow": workflow, "key": f"order-{i}", "input": {"text": f"item {i}"}}
            )
            channel.basic_publish(
                "",
                names.submit,
                body.encode(),
                pika.BasicProperties(delivery_mode=2, content_type="application/json"),
            )


def test_two_schedulers_race_over_1000_runs_submitted_through_rabbitmq(
    engine: Engine, names: Names, procs: Processes
) -> None:
    """Every run completes; every step is dispatched exactly once (attempt 1, one dispatch
    event); no row is claimed twice; a completion notification reaches the status exchange for
    every run. Prints the throughput."""
    status_queue = harness.bind_status_queue(names, "pipeline.run.completed")
    procs.start("submitter", "submitter")
    procs.start("scheduler-1", "scheduler")
    procs.start("scheduler-2", "scheduler")
    procs.start("agent-1", "agent", "echo", "--concurrency", "8")
    procs.start("agent-2", "agent", "echo", "--concurrency", "8")
    procs.wait_ready("submitter", "scheduler-1", "scheduler-2", "agent-1", "agent-2")
    started = time.monotonic()
    _publish_submissions(names, RUNS)
    cli = procs.run(
        "submit",
        "pipeline",
        "--input",
        '{"text": "from the cli"}',
        "--key",
        "cli-1",
        "--via-broker",
    )
    assert cli.returncode == 0, cli.stderr
    harness.wait_for(
        harness.all_runs_in(engine, {"completed"}, RUNS + 1),
        timeout=240,
        interval=0.2,
        what=f"{RUNS + 1} runs completed",
    )
    elapsed = time.monotonic() - started
    procs.assert_alive()
    print(
        f"\n[acceptance] {RUNS + 1} two-step runs completed in {elapsed:.1f}s "
        f"= {(RUNS + 1) / elapsed:.0f} runs/s (2 schedulers, 2 agents x 8 threads)"
    )

    with engine.connect() as conn:
        attempts = conn.execute(
            select(steps.c.attempt, func.count()).group_by(steps.c.attempt)
        ).all()
        dispatches = conn.execute(
            select(events.c.step_id, func.count())
            .where(events.c.from_state == "pending", events.c.to_state == "processing")
            .group_by(events.c.step_id)
        ).all()
        claimers = conn.execute(
            select(events.c.actor, func.count())
            .where(events.c.from_state == "pending", events.c.to_state == "processing")
            .group_by(events.c.actor)
        ).all()
        completed_ids = set(conn.execute(select(runs.c.id)).scalars())
    assert attempts == [(1, 2 * (RUNS + 1))]
    assert len(dispatches) == 2 * (RUNS + 1)
    assert {count for _, count in dispatches} == {1}
    print(f"[acceptance] steps claimed per scheduler: {dict(claimers)}")

    def all_completed(ms: list[dict[str, object]]) -> bool:
        return {m["run_id"] for m in ms} >= completed_ids

    notes = harness.drain_json(status_queue, until=all_completed, timeout=60)
    assert {m["run_id"] for m in notes} == completed_ids
    assert {m["_routing_key"] for m in notes} == {"pipeline.run.completed"}


def test_sigterm_stops_every_process_cleanly_with_exit_code_0(
    engine: Engine, names: Names, procs: Processes
) -> None:
    for name, args in {
        "submitter": ["submitter"],
        "scheduler": ["scheduler"],
        "agent": ["agent", "echo"],
    }.items():
        procs.start(name, *args)
    procs.wait_ready("submitter", "scheduler", "agent")
    key = uuid.uuid4().hex
    submitted = procs.run("submit", "pipeline", "--input", '{"text": "x"}', "--key", key)
    assert submitted.returncode == 0, submitted.stderr
    harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")
    for name in ("submitter", "scheduler", "agent"):
        procs.signal(name, signal.SIGTERM)
    codes = {name: procs.wait(name) for name in ("submitter", "scheduler", "agent")}
    assert codes == {"submitter": 0, "scheduler": 0, "agent": 0}
    assert "stopped" in procs.log("scheduler")
