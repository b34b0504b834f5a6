"""The built-in `command` workflow and agent on the real services: exit 0 completes the run with
the output tails, another code fails it with them, bad input fails it with the reason, and a
program still running at the deadline is killed and gets no reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow import Registry, submit_run
from sasflow.agents.children import ChildProcesses
from sasflow.agents.command import make_agent, make_workflow, registry
from sasflow.agents.worker import AgentOptions, AgentWorker
from sasflow.store.schema import runs
from sasflow.transport.topology import Names
from tests import harness
from tests.integration.test_children import _group

pytestmark = pytest.mark.integration


def _runs(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(select(runs.c.business_key, runs.c.state, runs.c.output))
        return {r.business_key: (r.state, r.output) for r in rows}


def test_command_runs_complete_or_fail_with_their_output(
    engine: Engine, database_url: str, names: Names
) -> None:
    inputs = {
        "ok": {"argv": ["sh", "-c", 'echo "hello $WHO"; pwd'], "env": {"WHO": "you"}, "cwd": "/"},
        "exit-4": {"argv": ["sh", "-c", "echo partial; echo broken >&2; exit 4"]},
        "shell-string": {"argv": "echo hi"},
        "no-such-program": {"argv": ["/nonexistent/program"]},
    }
    with engine.begin() as conn:
        for key, value in inputs.items():
            submit_run(conn, registry, "command", value, key=key, namespace=names.namespace)
    worker = harness.agent(make_agent(), names)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.wait_for(
            harness.all_runs_in(engine, {"completed", "error"}, len(inputs)), what="4 runs end"
        )
    found = _runs(engine)
    assert found["ok"][0] == "completed"
    step_output = found["ok"][1]["run"]
    assert (step_output["exit_code"], step_output["stdout"], step_output["stderr"]) == (
        0,
        "hello you\n/\n",
        "",
    )
    errors = {s.run_id: s.error for s in harness.step_rows(engine)}
    by_key = dict(zip(inputs, sorted(errors), strict=True))
    assert {k: found[k][0] for k in inputs} == {
        "ok": "completed",
        "exit-4": "error",
        "shell-string": "error",
        "no-such-program": "error",
    }
    failed = errors[by_key["exit-4"]]
    assert failed["type"] == "CommandFailedError"
    assert "exited with code 4" in failed["message"]
    assert "broken" in failed["message"]
    assert "partial" in failed["message"]
    assert "list of strings" in errors[by_key["shell-string"]]["message"]
    assert "cannot start" in errors[by_key["no-such-program"]]["message"]


def test_a_program_running_at_the_deadline_is_killed_and_the_agent_stays_silent(
    engine: Engine, database_url: str, names: Names, tmp_path: Path
) -> None:
    agent = make_agent()
    short = Registry([make_workflow(timeout=1.0)], [agent])
    with engine.begin() as conn:
        argv = ["sh", "-c", "sleep 600 & wait"]
        submit_run(conn, short, "command", {"argv": argv}, key="k", namespace=names.namespace)
    worker = AgentWorker(
        agent,
        harness.transport("agent-command"),
        names,
        options=AgentOptions(children=ChildProcesses(tmp_path)),
    )
    seen: list[int] = []

    def running() -> bool:
        seen.extend(int(p.stem) for p in tmp_path.glob("*.json"))
        return bool(seen)

    with harness.running(harness.scheduler(engine, database_url, short, names), worker):
        harness.wait_for(running, what="the program started")
        harness.wait_for(lambda: worker.stats.abandoned == 1, what="the deadline")
        harness.wait_for(lambda: not _group(seen[0]), timeout=10, what="the group killed")
    assert (worker.stats.replied_ok, worker.stats.replied_error, worker.stats.deferred) == (0, 0, 0)
    (step,) = harness.step_rows(engine)
    assert step.state == "processing", "no reply: the supervisor decides at the deadline"
