"""A publish the broker nacks was not taken, for now: the broker could not store it (a quorum
queue whose leader is being elected, a queue full under `reject-publish`; RabbitMQ 3.10 also
keeps nacking every publish of a channel that first published to a quorum queue just after its
leader's node died, until the channel is closed). It is sent again on a new connection, never
failed for good: a nacked request must not fail its step, a nacked reply must not be lost.

The queue refuses here through a policy of this test's own (`max-length` 0, `reject-publish`),
named after its namespace and cleared at its end."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sasflow.transport.topology import Names
from tests import harness
from tests.apps import basic

pytestmark = pytest.mark.integration

REFUSE_ALL = json.dumps({"max-length": 0, "overflow": "reject-publish"})


@contextlib.contextmanager
def refusing(names: Names, queue: str) -> Iterator[None]:
    """Every publish to `queue` is nacked while the block runs."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl is needed to set a policy")
    policy = f"{names.namespace}-refuse"
    pattern = "^" + queue.replace(".", r"\.") + "$"
    subprocess.run(
        [ctl, "-q", "set_policy", policy, pattern, REFUSE_ALL, "--apply-to", "queues"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        yield
    finally:
        subprocess.run(
            [ctl, "-q", "clear_policy", policy], check=False, capture_output=True, timeout=60
        )


def test_a_request_the_broker_nacks_is_dispatched_again_not_failed(
    engine: Engine, database_url: str, names: Names
) -> None:
    run_id = harness.submit(
        engine, basic.registry, names, "pipeline", key="nacked-1", run_input={"text": "again"}
    )
    scheduler = harness.scheduler(engine, database_url, basic.registry, names, rescan_interval=0.2)
    agent = harness.agent(basic.echo, names)
    with contextlib.ExitStack() as refusal:
        refusal.enter_context(refusing(names, names.agent("echo")))
        with harness.running(scheduler, agent):
            harness.wait_for(lambda: scheduler.stats.released >= 2, what="dispatches refused")
            first = harness.step_rows(engine, run_id)[0]
            assert (first.state, first.failure_count) == ("pending", 0)
            refusal.close()  # the queue takes messages again
            harness.wait_for(harness.all_runs_in(engine, {"completed"}, 1), what="run completes")


def test_a_reply_the_broker_nacks_is_sent_again_not_lost(
    engine: Engine, database_url: str, names: Names
) -> None:
    """No supervisor runs: a reply lost would leave the step processing for good."""
    run_id = harness.submit(
        engine, basic.registry, names, "pipeline", key="nacked-2", run_input={"text": "again"}
    )
    scheduler = harness.scheduler(engine, database_url, basic.registry, names, rescan_interval=0.2)
    agent = harness.agent(basic.echo, names)
    with contextlib.ExitStack() as refusal:
        refusal.enter_context(refusing(names, names.replies))
        with harness.running(scheduler, agent):
            harness.wait_for(lambda: agent.stats.received >= 1, what="a request taken")
            time.sleep(1.5)  # its reply is refused meanwhile
            assert harness.step_rows(engine, run_id)[0].state == "processing"
            refusal.close()
            harness.wait_for(
                harness.all_runs_in(engine, {"completed"}, 1), timeout=20, what="run completes"
            )
    assert [s.failure_count for s in harness.step_rows(engine, run_id)] == [0, 0]
    assert agent.stats.silent == 0
