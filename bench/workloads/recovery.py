"""Recovery: kill -9 of the agent holding a step until another agent completes it."""

from __future__ import annotations

import json
import signal
import statistics
import time
from pathlib import Path

from sqlalchemy import text

from bench.common import Sizes, processes, scratch, wait_until
from bench.report import Results, report, say, verdict
from sasflow import submit_run
from tests.apps import ops

KILLABLE_DEADLINE = 3.0  # tests/apps/ops.py: killable's step timeout
SUPERVISOR_INTERVAL = 0.5


def _calls(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def recovery_once(standby: bool) -> tuple[float, int, float]:
    """kill -9 the agent holding a `killable` step; seconds until the step is completed by
    another agent, the attempt that completed it and the seconds until the supervisor
    reclaimed the step (nan with `standby`). With `standby` the second agent runs all along
    (the broker redelivers the killed agent's request to it); without, it is
    started when the supervisor has reclaimed the expired step (its start-up is counted)."""
    with (
        scratch("rec", ["remote"]) as (url, engine, names),
        processes(url, names, "tests.apps.ops") as procs,
    ):
        remote_log = procs.logs / "remote.jsonl"
        procs.env["SASFLOW_TEST_REMOTE_LOG"] = str(remote_log)
        procs.start("supervisor", "supervisor", "--interval", str(SUPERVISOR_INTERVAL))
        agents = {procs.start("agent-1", "agent", "remote").pid: "agent-1"}
        if standby:
            agents[procs.start("agent-2", "agent", "remote").pid] = "agent-2"
        time.sleep(1.5)
        procs.start("scheduler", "scheduler")
        time.sleep(1.5)
        with engine.begin() as conn:
            run = submit_run(
                conn, ops.registry, "killable", {"delay": 0.5}, key="k", namespace=names.namespace
            )
        if not wait_until(lambda: len(_calls(remote_log)) >= 1, 30, interval=0.005):
            raise RuntimeError("no agent took the killable step")
        victim = agents[int(str(_calls(remote_log)[0]["pid"]))]
        killed = time.perf_counter()
        procs.signal(victim, signal.SIGKILL)
        procs.wait(victim)

        def state() -> tuple[str, int]:
            with engine.connect() as conn:
                row = conn.execute(
                    text("SELECT state, failure_count FROM steps WHERE run_id = :r"),
                    {"r": run.run_id},
                ).one()
            return str(row[0]), int(row[1])

        reclaimed = float("nan")
        if not standby:
            if not wait_until(lambda: state()[1] >= 1, 30, interval=0.01):
                raise RuntimeError("the supervisor did not reclaim the expired step")
            reclaimed = time.perf_counter() - killed
            procs.start("agent-2", "agent", "remote")
        if not wait_until(lambda: state()[0] == "processed", 60, interval=0.01):
            raise RuntimeError(f"the step was not completed after the kill: {state()}")
        took = time.perf_counter() - killed
        calls = _calls(remote_log)
        return took, int(str(calls[-1]["attempt"])), reclaimed


def run_recovery(sizes: Sizes, results: Results) -> None:
    target = KILLABLE_DEADLINE + SUPERVISOR_INTERVAL + 1
    say(
        f"Recovery: kill -9 of the agent holding a step (deadline {KILLABLE_DEADLINE:g}s, "
        f"supervisor --interval {SUPERVISOR_INTERVAL:g}, step work 0.5 s) until its "
        "completion by another agent",
        results,
    )
    for standby, name in ((False, "recovery via supervisor"), (True, "recovery standby agent")):
        outcomes = [recovery_once(standby) for _ in range(sizes.repeat)]
        took = [t for t, _, _ in outcomes]
        attempts = sorted({a for _, a, _ in outcomes})
        if not standby:
            report(
                results,
                "recovery kill -> reclaimed",
                [r for _, _, r in outcomes],
                "s",
                f"target <= deadline + interval = {target - 1:g}s: "
                f"{verdict(statistics.median(r for _, _, r in outcomes) <= target - 1)}",
                fmt=".2f",
            )
        startup = "" if standby else " and the new agent's start-up"
        report(
            results,
            name,
            took,
            "s",
            f"completed by attempt {attempts}, includes the 0.5 s of work{startup}; "
            f"target <= {target:g}s: {verdict(statistics.median(took) <= target)}",
            fmt=".2f",
        )
