"""A queue deleted under the role that consumes it (an operator's `delete_queue`, a node lost
while the connection stays up): the broker cancels the consumer, and the role handles it as a
lost connection: it logs one warning naming the queue, tells its hooks, connects again,
declares its queues and consumes, within seconds; work submitted afterwards completes with each
handler run once.

Each test deletes only its own namespace's queue, over a channel of its own (no management
plugin, no rabbitmqctl)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pika.exceptions
import pytest
from sqlalchemy import Engine, func, select

from sasflow.hooks import Hooks
from sasflow.messages import Request
from sasflow.store.schema import runs
from sasflow.submitter import Submitter
from sasflow.transport.topology import Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

BACK_WITHIN_S = 10.0
"""Seconds from the deletion until the role consumes the queue again (measured: well under
one: the first reconnect delay is 0.2 s)."""


class Observed(Hooks):
    """What the tests read from a role's hooks: cancelled queues, handler starts per step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled: list[str] = []
        self.started: Counter[int] = Counter()

    def consumer_cancelled(self, queue: str) -> None:
        with self._lock:
            self.cancelled.append(queue)

    def handler_started(self, request: Request, headers: Mapping[str, Any]) -> None:  # noqa: ARG002
        with self._lock:
            self.started[request.step_id] += 1


def _consumers(queue: str) -> int:
    """Consumers of `queue` now (0 while it does not exist)."""
    try:
        with services.broker_channel() as channel:
            declared = channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    return int(declared.method.consumer_count or 0)


def _delete_and_time_until_consumed(queue: str) -> float:
    """Delete `queue` under its consumer; seconds until a consumer is back on it."""
    harness.wait_for(lambda: _consumers(queue) == 1, what=f"a consumer on {queue}")
    with services.broker_channel() as channel:
        channel.queue_delete(queue)
    deleted = time.monotonic()
    harness.wait_for(
        lambda: _consumers(queue) == 1,
        timeout=BACK_WITHIN_S,
        what=f"{queue} consumed again",
        interval=0.02,
    )
    return time.monotonic() - deleted


def _submit(engine: Engine, names: Names, key: str) -> int:
    return harness.submit(
        engine, basic.registry, names, "pipeline", key=key, run_input={"text": key}
    )


def _warnings_naming(caplog: pytest.LogCaptureFixture, queue: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and "cancelled" in r.getMessage()
        and queue in r.getMessage()
    ]


def _each_step_ran_once(engine: Engine, observed: Observed, run_ids: list[int]) -> None:
    rows = [r for run_id in run_ids for r in harness.step_rows(engine, run_id)]
    assert [(r.state, r.attempt, r.failure_count) for r in rows] == [("processed", 1, 0)] * len(
        rows
    )
    assert {r.id: observed.started[r.id] for r in rows} == {r.id: 1 for r in rows}


def test_agent_consumes_again_after_its_request_queue_is_deleted(
    engine: Engine, database_url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    observed = Observed()
    queue = names.agent("echo")
    with harness.running(
        harness.scheduler(engine, database_url, basic.registry, names),
        harness.agent(basic.echo, names, hooks=observed),
    ):
        first = _submit(engine, names, "before")
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="first run")
        with caplog.at_level(logging.WARNING):
            _delete_and_time_until_consumed(queue)
            second = _submit(engine, names, "after")
            harness.wait_for(harness.all_runs_in(engine, {"completed"}, 2), what="second run")
    assert observed.cancelled == [queue]
    assert len(_warnings_naming(caplog, queue)) == 1
    _each_step_ran_once(engine, observed, [first, second])


def test_scheduler_consumes_again_after_the_replies_queue_is_deleted(
    engine: Engine, database_url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """Replies are applied again (no step waits for its deadline): each handler runs once."""
    on_scheduler, on_agent = Observed(), Observed()
    with harness.running(
        harness.scheduler(engine, database_url, basic.registry, names, hooks=on_scheduler),
        harness.agent(basic.echo, names, hooks=on_agent),
    ):
        first = _submit(engine, names, "before")
        harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="first run")
        with caplog.at_level(logging.WARNING):
            _delete_and_time_until_consumed(names.replies)
            later = [_submit(engine, names, f"after-{i}") for i in range(3)]
            harness.wait_for(
                harness.all_runs_in(engine, {"completed"}, 4), timeout=15, what="later runs"
            )
    assert on_scheduler.cancelled == [names.replies]
    assert len(_warnings_naming(caplog, names.replies)) == 1
    _each_step_ran_once(engine, on_agent, [first, *later])


def test_submitter_consumes_again_after_the_submit_queue_is_deleted(
    engine: Engine, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    observed = Observed()
    role = Submitter(engine, harness.transport("submitter"), basic.registry, names, hooks=observed)

    def recorded() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())

    def send(key: str) -> None:
        body = json.dumps({"workflow": "pipeline", "key": key, "input": {"text": key}})
        harness.publish_raw(names.submit, body.encode())

    with harness.running(role):
        harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
        send("before")
        harness.wait_for(lambda: recorded() == 1, what="first submission")
        with caplog.at_level(logging.WARNING):
            _delete_and_time_until_consumed(names.submit)
            send("after")
            harness.wait_for(lambda: recorded() == 2, what="submission after the deletion")
    assert observed.cancelled == [names.submit]
    assert len(_warnings_naming(caplog, names.submit)) == 1
    assert (role.stats.created, role.stats.dead_lettered) == (2, 0)
