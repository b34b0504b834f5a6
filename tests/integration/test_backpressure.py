"""Backpressure at the doors on PostgreSQL and RabbitMQ: `submit_run`'s policies and
`wait_for_room`, the submitter holding (or rejecting) submissions past a workflow's bound, and
the backlog read (docs/backpressure.md). The HTTP API's 429 is in test_backpressure_api.py."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import Engine, select, update

from sasflow import BacklogFullError, ConfigurationError, Registry, Workflow, submit_run
from sasflow.backpressure import OnBacklog, SubmitterBackpressure
from sasflow.client import wait_for_room
from sasflow.messages import Submission
from sasflow.states import RunState
from sasflow.store.runs.backlog import backlog_by_workflow, read_backlog
from sasflow.store.schema import runs
from sasflow.submitter import Submitter
from sasflow.transport.topology import REASON_HEADER, Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

BOUNDED = Workflow("bounded", list(basic.pipeline.steps), max_backlog=2)
registry = Registry([basic.pipeline, BOUNDED], [basic.echo])


def _keys(engine: Engine, workflow: str) -> list[str]:
    with engine.connect() as conn:
        query = select(runs.c.business_key).where(runs.c.workflow == workflow).order_by(runs.c.id)
        return [str(k) for k in conn.execute(query).scalars()]


def _start(engine: Engine, keys: list[str]) -> None:
    """Make runs leave the backlog, as a scheduler claiming their first step does."""
    with engine.begin() as conn:
        conn.execute(
            update(runs).where(runs.c.business_key.in_(keys)).values(state=RunState.RUNNING)
        )


def _submit(engine: Engine, key: str, on_backlog: OnBacklog = "accept") -> int:
    with engine.begin() as conn:
        return submit_run(
            conn, registry, "bounded", {"text": key}, key=key, namespace="t", on_backlog=on_backlog
        ).run_id


def test_the_backlog_counts_waiting_runs_of_one_workflow_up_to_the_cap(engine: Engine) -> None:
    """Pending runs only, of the workflow asked for, never more than the cap; the oldest's
    age on the database clock; the gauge's grouped count is exact."""
    for i in range(4):
        _submit(engine, f"b{i}")
    with engine.begin() as conn:
        submit_run(conn, registry, "pipeline", {"text": "x"}, key="other", namespace="t")
    _start(engine, ["b0"])
    with engine.connect() as conn:
        assert read_backlog(conn, "bounded", cap=100).count == 3
        capped = read_backlog(conn, "bounded", cap=2)
        assert capped.count == 2
        assert capped.oldest is not None
        assert capped.oldest_age_s >= 0
        assert read_backlog(conn, "nothing-here", cap=5).count == 0
        assert backlog_by_workflow(conn) == {"bounded": 3, "pipeline": 1}


def test_submit_run_rejects_past_the_bound_but_answers_a_known_key(engine: Engine) -> None:
    """on_backlog="reject": BacklogFullError naming the workflow, backlog and bound once the
    workflow's own max_backlog (2) is reached; a key that names a run is answered, not
    refused; "accept" (the default) records anyway; room made by a start is seen at once."""
    first = _submit(engine, "r1", on_backlog="reject")
    _submit(engine, "r2", on_backlog="reject")
    with pytest.raises(BacklogFullError) as refused:
        _submit(engine, "r3", on_backlog="reject")
    assert (refused.value.workflow, refused.value.backlog, refused.value.bound) == (
        "bounded",
        2,
        2,
    )
    assert refused.value.retry_after > 0
    assert _submit(engine, "r1", on_backlog="reject") == first  # idempotent, never refused
    _submit(engine, "r4")  # accept
    assert _keys(engine, "bounded") == ["r1", "r2", "r4"]
    _start(engine, ["r1", "r2"])
    _submit(engine, "r5", on_backlog="reject")  # r4 waits: one place left
    assert _keys(engine, "bounded")[-1] == "r5"


def test_submit_run_counts_the_callers_own_uncommitted_runs(engine: Engine) -> None:
    """Runs submitted earlier in the same transaction count: one transaction cannot pass the
    bound by itself."""
    with engine.begin() as conn:
        for key in ("t1", "t2"):
            submit_run(conn, registry, "bounded", {}, key=key, namespace="t", on_backlog="reject")
        with pytest.raises(BacklogFullError):
            submit_run(conn, registry, "bounded", {}, key="t3", namespace="t", on_backlog="reject")


def test_block_is_not_offered_inside_the_callers_transaction(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(ConfigurationError, match="wait_for_room"):
        submit_run(
            conn,
            registry,
            "bounded",
            {},
            namespace="t",
            on_backlog="block",  # type: ignore[arg-type]
        )


def test_wait_for_room_returns_when_a_run_starts_and_times_out_otherwise(
    engine: Engine,
) -> None:
    """It waits in transactions of its own: it returns once a run left the backlog, and
    raises BacklogFullError when none does within the timeout (database clock)."""
    assert wait_for_room(engine, registry, "bounded", timeout=0).free == 2
    _submit(engine, "w1")
    _submit(engine, "w2")
    began = time.monotonic()
    with pytest.raises(BacklogFullError):
        wait_for_room(engine, registry, "bounded", timeout=0.4, poll=0.1)
    assert time.monotonic() - began >= 0.4
    starter = threading.Timer(0.5, _start, args=(engine, ["w1"]))
    starter.start()
    try:
        room = wait_for_room(engine, registry, "bounded", timeout=10, poll=0.05)
    finally:
        starter.join()
    assert room.free == 1
    assert wait_for_room(engine, registry, "pipeline", timeout=0, max_backlog=0).bound is None


def _publish(names: Names, workflow: str, keys: list[str]) -> None:
    for key in keys:
        harness.publish_raw(
            names.submit,
            Submission(workflow=workflow, input={"text": key}, key=key).encode(),
            content_type="application/json",
        )


def _ready(names: Names) -> int:
    """Messages of `<ns>.submit` ready for a consumer (not counting those held unacked)."""
    with services.broker_channel() as channel:
        declared = channel.queue_declare(names.submit, passive=True)
    return int(declared.method.message_count or 0)


def _submitter(engine: Engine, names: Names, policy: str, *, hold_s: float = 60.0) -> Submitter:
    return Submitter(
        engine,
        harness.transport("submitter"),
        registry,
        names,
        prefetch=50,
        backpressure=SubmitterBackpressure(policy=policy, hold_s=hold_s),  # type: ignore[arg-type]
    )


def test_the_submitter_holds_submissions_in_its_queue_until_there_is_room(
    engine: Engine, names: Names
) -> None:
    """Past the bound (2) the submitter records nothing more and acks nothing more: the
    submissions stay in `<ns>.submit` (held unacked). Each start makes room and the next
    submission, in arrival order, is recorded; a resubmitted key is answered meanwhile. The
    other workflow of the same queue is not held by this bound."""
    role = _submitter(engine, names, "hold")
    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
        _publish(names, "bounded", ["h1", "h2", "h3", "h4", "h5"])
        _publish(names, "pipeline", ["p1"])
        harness.wait_for(lambda: len(_keys(engine, "pipeline")) == 1, what="pipeline run")
        harness.wait_for(lambda: role.stats.held == 3, what="three held")
        time.sleep(1.5)  # two more reads of the backlog: still no room
        assert _keys(engine, "bounded") == ["h1", "h2"]
        assert role.stats.dead_lettered == 0
        _publish(names, "bounded", ["h1"])  # known key: a duplicate, acked at once
        harness.wait_for(lambda: role.stats.duplicates == 1, what="the duplicate answered")
        _start(engine, ["h1"])
        harness.wait_for(lambda: len(_keys(engine, "bounded")) == 3, what="one more admitted")
        time.sleep(1.5)
        assert _keys(engine, "bounded") == ["h1", "h2", "h3"]
        _start(engine, ["h2", "h3"])
        harness.wait_for(lambda: len(_keys(engine, "bounded")) == 5, what="the rest admitted")
        assert _keys(engine, "bounded") == ["h1", "h2", "h3", "h4", "h5"]
    assert _ready(names) == 0  # and nothing held: the role acked every one before it stopped
    assert role.stats.created == 6


def test_held_submissions_go_back_to_the_queue_after_hold_s_and_are_taken_again(
    engine: Engine, names: Names
) -> None:
    """No delivery stays unacked longer than hold_s: it is handed back to the queue and comes
    back (held again), so the broker's consumer timeout never fires; nothing is lost."""
    role = _submitter(engine, names, "hold", hold_s=0.5)
    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
        _publish(names, "bounded", ["q1", "q2", "q3"])
        harness.wait_for(lambda: role.stats.held >= 3, what="held again after a requeue")
        assert _keys(engine, "bounded") == ["q1", "q2"]
        _start(engine, ["q1"])
        harness.wait_for(lambda: len(_keys(engine, "bounded")) == 3, what="q3 admitted")
    assert role.stats.created == 3


def test_the_reject_policy_dead_letters_with_the_reason(engine: Engine, names: Names) -> None:
    role = _submitter(engine, names, "reject")
    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
        _publish(names, "bounded", ["d1", "d2", "d3"])
        dead = harness.dead_letters(names, 1)
    assert _keys(engine, "bounded") == ["d1", "d2"]
    assert json.loads(dead[0]["body"])["key"] == "d3"
    reason = str(dead[0]["headers"][REASON_HEADER])
    assert reason.startswith("backlog full: workflow 'bounded' has 2 run(s) waiting")
    assert role.stats.dead_lettered == 1
