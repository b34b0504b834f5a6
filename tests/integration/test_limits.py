"""Every entry point refuses a message beyond the limits, with the limit in the reason, before
any database work: the submitter and the scheduler dead-letter it, an agent dead-letters a
request, `submit_run` raises InvalidInputError; nothing is stored."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from sasflow import InvalidInputError, submit_run
from sasflow.agents.worker import AgentWorker
from sasflow.messages import Limits, Reply, Request
from sasflow.store.schema import runs
from sasflow.submitter import Submitter
from sasflow.transport.topology import SOURCE_HEADER, Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

LIMIT = 1024 * 1024
SIZE_REASON = "exceeds the limit of 1048576 bytes (SASFLOW_MAX_MESSAGE_BYTES)"
DEPTH_REASON = "JSON nested deeper than the limit of 64 levels (SASFLOW_MAX_JSON_DEPTH)"


def _runs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())


def _just_over(size: int) -> bytes:
    head, tail = b'{"workflow":"pipeline","key":"big","input":{"text":"', b'"}}'
    return head + b"x" * (size + 1 - len(head) - len(tail)) + tail


def test_submitter_dead_letters_submissions_beyond_the_limits_and_stores_no_run(
    engine: Engine, names: Names
) -> None:
    role = Submitter(engine, harness.transport("submitter"), basic.registry, names)
    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
        harness.publish_raw(names.submit, _just_over(LIMIT))
        harness.publish_raw(names.submit, b"[" * 100_000 + b"]" * 100_000)
        harness.publish_raw(names.submit, b'{"workflow":"pipeline","key":"n","input":null}')
        dead = harness.dead_letters(names, 3)
    reasons = sorted(str(d["reason"]) for d in dead)
    assert reasons == sorted(
        [
            f"Submission: message of {LIMIT + 1} bytes {SIZE_REASON}",
            f"Submission: {DEPTH_REASON}",
            "Submission: input: Value error, the run input must be a JSON object, got null",
        ]
    )
    assert {d["headers"][SOURCE_HEADER] for d in dead} == {names.submit}
    assert (_runs(engine), role.stats.dead_lettered, role.stats.created) == (0, 3, 0)


def test_submit_run_refuses_an_input_beyond_the_limits_or_not_an_object(engine: Engine) -> None:
    deep: Any = {}
    for _ in range(100):
        deep = {"a": deep}
    cases: list[tuple[Any, str]] = [
        ({"text": "x" * LIMIT}, SIZE_REASON),
        (deep, DEPTH_REASON),
        (None, "the run input must be a JSON object"),
        ([1, 2], "the run input must be a JSON object"),
    ]
    for value, reason in cases:
        with engine.begin() as conn, pytest.raises(InvalidInputError) as refused:
            submit_run(conn, basic.registry, "pipeline", value, namespace="t")
        assert reason in str(refused.value)
    small = Limits(max_message_bytes=2048)
    with engine.begin() as conn, pytest.raises(InvalidInputError, match="limit of 2048 bytes"):
        submit_run(
            conn, basic.registry, "pipeline", {"text": "x" * 4096}, namespace="t", limits=small
        )
    assert _runs(engine) == 0


def test_scheduler_dead_letters_a_reply_beyond_its_limits(
    engine: Engine, database_url: str, names: Names
) -> None:
    """A reply over the limit is not parsed, so it cannot name its step: dead-lettered with the
    reason (the step then expires at its deadline). sasflow's agents never send one: they send
    an `error` reply saying so instead (tests/unit/test_limits.py)."""
    with engine.begin() as conn:
        run = submit_run(
            conn, basic.registry, "pipeline", {"text": "a"}, key="k", namespace=names.namespace
        )
    role = harness.scheduler(
        engine, database_url, basic.registry, names, limits=Limits(max_message_bytes=4096)
    )
    with harness.running(role):
        harness.wait_for(lambda: role.stats.dispatched == 1, what="first dispatch")
        (step,) = [r for r in harness.step_rows(engine, run.run_id) if r.name == "a"]
        big = Reply(step_id=step.id, attempt=1, status="ok", output={"text": "x" * 8192})
        harness.publish_raw(names.replies, big.encode())
        deep = b'{"step_id":%d,"attempt":1,"status":"ok","output":' % step.id
        harness.publish_raw(names.replies, deep + b"[" * 100 + b"]" * 100 + b"}")
        dead = harness.dead_letters(names, 2)
    reasons = sorted(str(d["reason"]) for d in dead)
    assert reasons == sorted(
        [
            (
                f"Reply: message of {len(big.encode())} bytes exceeds the limit of 4096 bytes "
                "(SASFLOW_MAX_MESSAGE_BYTES)"
            ),
            f"Reply: {DEPTH_REASON}",
        ]
    )
    rows = {r.name: r for r in harness.step_rows(engine, run.run_id)}
    assert (rows["a"].state, rows["a"].output) == ("processing", None)
    assert role.stats.applied == 0


def test_agent_dead_letters_a_request_beyond_its_limits(names: Names) -> None:
    role = AgentWorker(
        basic.echo,
        harness.transport("agent-echo"),
        names,
        limits=Limits(max_message_bytes=2048),
        stop=threading.Event(),
    )
    request = Request(
        step_id=1,
        run_id=1,
        attempt=1,
        workflow="pipeline",
        step="a",
        agent="echo",
        action="upper",
        input={"text": "x" * 4096},
        idempotency_key="k",
        budget_ms=10_000,
        complete_by="2025-01-31T12:00:00+00:00",
    )
    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.agent("echo")), what="agent queue")
        harness.publish_raw(names.agent("echo"), request.encode())
        (dead,) = harness.dead_letters(names, 1)
    assert dead["reason"] == (
        f"Request: message of {len(request.encode())} bytes exceeds the limit of 2048 bytes "
        "(SASFLOW_MAX_MESSAGE_BYTES)"
    )
    assert role.stats.received == 0
