"""Submit -> claim -> dispatch -> agent -> reply -> advance -> notify, on the real services."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from sasflow.commands import NewRun
from sasflow.store.db import transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import events, runs
from sasflow.transport.topology import Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration


def _submit(
    engine: Engine, names: Names, workflow: str, key: str, text: str, *, reply_to: str | None = None
) -> int:
    with transaction(engine) as conn:
        return submit(
            conn,
            basic.registry,
            NewRun(workflow=workflow, key=key, input={"text": text}, reply_to=reply_to),
            namespace=names.namespace,
            actor="test",
        ).run_id


def test_sequence_and_fan_out_fan_in_complete_with_outputs_flowing(
    engine: Engine, database_url: str, names: Names
) -> None:
    """A two-step sequence and a diamond DAG both complete; each step saw earlier outputs."""
    seq = _submit(engine, names, "pipeline", "seq-1", "hello")
    dag = _submit(engine, names, "diamond", "dag-1", "hi")
    with harness.running(
        harness.scheduler(engine, database_url, basic.registry, names),
        harness.agent(basic.echo, names),
    ):
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 2), what="runs complete")
    with engine.connect() as conn:
        outputs = dict(conn.execute(select(runs.c.id, runs.c.output)).all())
    assert outputs[seq] == {"b": {"length": 5}}
    assert outputs[dag] == {"end": {"joined": "HI-2"}}
    diamond_steps = {r.name: r for r in harness.step_rows(engine, dag)}
    assert diamond_steps["end"].input == ["HI", 2]
    assert {r.attempt for r in diamond_steps.values()} == {1}


def test_status_notifications_reach_the_topic_exchange_and_reply_to(
    engine: Engine, database_url: str, names: Names
) -> None:
    """Every run state change goes to <ns>.status and the submitter's reply_to queue, with the
    run id and business key for correlation."""
    status_queue = harness.bind_status_queue(names, "pipeline.#")
    reply_queue = f"{names.namespace}.client-replies"
    with services.broker_channel() as channel:
        channel.queue_declare(reply_queue, durable=True)
    run_id = _submit(engine, names, "pipeline", "order-42", "abc", reply_to=reply_queue)
    with harness.running(
        harness.scheduler(engine, database_url, basic.registry, names),
        harness.agent(basic.echo, names),
    ):
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")

        def completed(ms: list[dict[str, object]]) -> bool:
            return any(m["entity"] == "run" and m["state"] == "completed" for m in ms)

        on_status = harness.drain_json(status_queue, until=completed)
        on_reply_to = harness.drain_json(reply_queue, until=completed)
    for messages in (on_status, on_reply_to):
        run_states = [m["state"] for m in messages if m["entity"] == "run"]
        assert run_states == ["pending", "running", "completed"]
        step_done = [
            m["step"] for m in messages if m["entity"] == "step" and m["state"] == "processed"
        ]
        assert step_done == ["a", "b"]
        assert {m["run_id"] for m in messages} == {run_id}
        assert {m["key"] for m in messages} == {"order-42"}
        assert {m["_headers"]["key"] for m in messages} == {"order-42"}
    assert {m["_routing_key"] for m in on_status if m["entity"] == "run"} == {
        "pipeline.run.pending",
        "pipeline.run.running",
        "pipeline.run.completed",
    }
    completed_msg = next(m for m in on_status if m["state"] == "completed")
    assert completed_msg["detail"] == {"output": {"b": {"length": 3}}}
    with engine.connect() as conn:
        unpublished = conn.execute(select(events.c.id).where(events.c.published.is_(False))).all()
    assert unpublished == []
