"""A real `sasflow agent --builtin command` process never leaves its programs behind: SIGTERM
kills them after --drain-timeout (and hands the step back), and after a kill -9 the restarted
agent kills what its predecessor left."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

from sasflow.messages import Request
from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import Processes
from tests.integration.test_children import _group

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

SLEEPERS = ["sh", "-c", "sleep 600 & wait"]


def _request(names: Names, reply_queue: str) -> None:
    request = Request(
        step_id=1,
        run_id=1,
        attempt=1,
        workflow="command",
        step="run",
        agent="command",
        action="run",
        input={"argv": SLEEPERS},
        idempotency_key=uuid.uuid4().hex,
        budget_ms=600_000,
        complete_by="2999-01-01T00:00:00+00:00",
    )
    harness.publish_raw(
        names.agent("command"), request.encode(), reply_to=reply_queue, correlation_id="1:1"
    )


def _reply_queue(names: Names) -> str:
    queue = f"{names.namespace}.test-replies"
    with services.broker_channel() as channel:
        channel.queue_declare(queue, durable=True)
    return queue


def _running_group(state_dir: Path) -> int:
    """The process group of the one program running, once its pid file is there."""
    harness.wait_for(lambda: any(state_dir.glob("*.json")), what="the program's pid file")
    (path,) = state_dir.glob("*.json")
    pgid = int(json.loads(path.read_text())["pid"])
    harness.wait_for(lambda: len(_group(pgid)) == 2, what="the shell and its sleep")
    return pgid


def _agent(procs: Processes, name: str, state_dir: Path) -> None:
    procs.start(
        name,
        "agent",
        "--builtin",
        "command",
        "--drain-timeout",
        "0.5",
        "--state-dir",
        str(state_dir),
        "--heartbeat-interval",
        "0.5",
    )


def test_sigterm_kills_the_programs_after_the_drain_timeout_and_hands_the_step_back(
    names: Names, procs: Processes, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    _agent(procs, "agent", state_dir)
    harness.wait_for(lambda: services.queue_exists(names.agent("command")), what="the queue")
    replies = _reply_queue(names)
    _request(names, replies)
    pgid = _running_group(state_dir)
    procs.signal("agent", signal.SIGTERM)
    assert procs.wait("agent", timeout=20) == 0
    assert _group(pgid) == [], "the program outlived its agent"
    (reply,) = harness.drain_json(replies, until=lambda found: len(found) == 1)
    assert (reply["status"], reply["defer_seconds"]) == ("deferred", 0.0)
    assert reply["error"]["type"] == "ChildKilledError"
    assert list(state_dir.glob("*.json")) == []


def test_after_kill_9_the_restarted_agent_kills_what_its_predecessor_left(
    names: Names, procs: Processes, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    _agent(procs, "first", state_dir)
    harness.wait_for(lambda: services.queue_exists(names.agent("command")), what="the queue")
    _request(names, _reply_queue(names))
    pgid = _running_group(state_dir)
    procs.signal("first", signal.SIGKILL)
    procs.wait("first")
    assert len(_group(pgid)) == 2, "the program died with its agent: nothing left to test"
    _agent(procs, "second", state_dir)
    harness.wait_for(lambda: not _group(pgid), timeout=20, what="the orphaned group killed")
    assert "left by a dead agent" in procs.log("second")
