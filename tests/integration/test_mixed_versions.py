"""Schedulers with different workflow versions side by side (a rolling deploy), and a changed
definition under an unchanged version, on the real services."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, insert, select

from sasflow import Registry, Step, StepContext, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.cli.main import cli
from sasflow.errors import DefinitionChangedError
from sasflow.scheduler.advancing import AdvanceOptions
from sasflow.store.schema import alerts, runs, steps, workflow_versions
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

FAST = StepPolicy(timeout=10)

svc = Agent("svc")


@svc.handler("go")
def go(call: Call) -> dict[str, Any]:
    return {"seen": call.input}


def _from_a(ctx: StepContext) -> Any:
    return {"a": ctx.outputs["a"]}


def _ver(version: int, *names: str) -> Workflow:
    return Workflow("ver", [Step(n, "svc", "go", policy=FAST) for n in names], version=version)


V1 = _ver(1, "a", "b")
V2 = Workflow(
    "ver",
    [Step("a", "svc", "go", policy=FAST), Step("b", "svc", "go", input=_from_a, policy=FAST)],
    version=2,
)
OLD = Registry([V1], [svc])
NEW = Registry([V1, V2], [svc])

QUICK = AdvanceOptions(interval=0.1, missing_after_s=0.3, missing_check_s=0.1)


def _run_rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(runs.c.id, runs.c.state, runs.c.advance_due)))


def _open_alerts(engine: Engine, kind: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(alerts.c.dedup_key, alerts.c.acknowledged).where(alerts.c.kind == kind)
            )
        )


def test_a_scheduler_without_the_version_leaves_the_runs_to_one_that_has_it(
    engine: Engine, database_url: str, names: Names
) -> None:
    """Scheduler A has `ver` v1 only; 8 runs of v2 are submitted. A claims and applies their
    first steps, and neither fails nor skips anything: the runs wait, marked for a scheduler
    that has v2, and a `version_missing` alert says nobody live has it. Once B (v1 and v2)
    runs too, all 8 complete, step b with the input v2's builder made; the alert resolves."""
    ids = [
        harness.submit(engine, NEW, names, "ver", key=f"k{i}", run_input={"i": i}) for i in range(8)
    ]
    agent = harness.agent(svc, names)
    old = harness.scheduler(engine, database_url, OLD, names, advance=QUICK)
    with harness.running(old, agent):

        def left_for_v2() -> bool:
            rows = _run_rows(engine)
            return all(r.advance_due is not None for r in rows) and len(rows) == 8

        harness.wait_for(left_for_v2, what="the 8 runs left for a scheduler with v2")
        harness.wait_for(
            lambda: bool(_open_alerts(engine, "version_missing")), what="version_missing"
        )
        assert {r.state for r in _run_rows(engine)} == {"running"}
        new = harness.scheduler(engine, database_url, NEW, names, advance=QUICK)
        with harness.running(new):
            harness.wait_for(
                harness.all_runs_in(engine, {"completed"}, 8), what="8 runs of v2 completed"
            )
            harness.wait_for(
                lambda: all(a.acknowledged for a in _open_alerts(engine, "version_missing")),
                what="the version_missing alert resolved",
            )
    with engine.connect() as conn:
        b_inputs = dict(
            conn.execute(select(steps.c.run_id, steps.c.input).where(steps.c.name == "b")).all()
        )
    assert {run_id: b_inputs[run_id] for run_id in ids} == {
        run_id: {"a": {"seen": {"i": i}}} for i, run_id in enumerate(ids)
    }
    assert _open_alerts(engine, "version_missing") == [("version_missing:ver@2", True)]


def test_a_changed_definition_under_its_old_version_is_refused_at_start(
    engine: Engine, database_url: str, names: Names
) -> None:
    """v1 of `ver` registered with steps a, b; a scheduler whose v1 has steps a, c (a rename
    without a new version) is refused at start with what to do, instead of failing the runs
    in flight with `KeyError: 'b'`; the run in flight is untouched."""
    run_id = harness.submit(engine, OLD, names, "ver", key="k", run_input={})
    first = harness.scheduler(engine, database_url, OLD, names)
    with harness.running(first):
        harness.wait_for(
            lambda: any(r.state == "processing" for r in harness.step_rows(engine, run_id)),
            what="step a dispatched",
        )
    changed = Registry([_ver(1, "a", "c")], [svc])
    refused = harness.scheduler(engine, database_url, changed, names)
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            refused.run()
        except BaseException as exc:  # noqa: BLE001 - what the role ends with
            crashed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        refused.stop()
        thread.join(30)
    assert len(crashed) == 1, crashed
    assert isinstance(crashed[0], DefinitionChangedError)
    message = str(crashed[0])
    assert message.startswith("workflow 'ver' version 1 differs from the definition registered")
    assert "give the changed definition a new version number" in message
    assert "\n" not in message
    states = {r.name: r.state for r in harness.step_rows(engine, run_id)}
    assert states == {"a": "processing", "b": "waiting"}


@pytest.mark.parametrize("role", ["scheduler", "submitter", "api"])
def test_the_roles_started_with_a_changed_definition_exit_78_with_one_line(
    engine: Engine, database_url: str, names: Names, role: str
) -> None:
    """`sasflow scheduler`, `sasflow submitter` and `sasflow api` whose app's `pipeline` v1
    differs from the registered one stop at start with exit status 78 (a service manager does
    not restart them) and one line saying to bump the version."""
    with engine.begin() as conn:
        conn.execute(
            insert(workflow_versions).values(
                workflow="pipeline", version=1, fingerprint="0" * 64, registered_by="old-host"
            )
        )
    result = CliRunner().invoke(
        cli,
        [role],
        env={
            "SASFLOW_DATABASE_URL": database_url,
            "SASFLOW_APP": "tests.apps.basic",
            "SASFLOW_NAMESPACE": names.namespace,
        },
    )
    assert result.exit_code == 78, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert line.startswith(
        "Error: workflow 'pipeline' version 1 differs from the definition registered by old-host"
    )
    assert line.endswith("give the changed definition a new version number (docs/howto/upgrade.md)")


def test_a_rolling_deploy_under_load_fails_no_run(
    engine: Engine, database_url: str, names: Names
) -> None:
    """Runs are submitted all along a rolling deploy of the schedulers: an old scheduler and
    agent (v1 only) run, a new scheduler and agent (v1 and v2) start beside them, submissions
    switch to v2, then the old ones stop. Every run of both versions completes: none fails,
    none is left behind. (Agents run the same code here: an agent lacking an action is the
    agents' side of a rolling deploy, tested with the agents.)"""
    submitted: list[int] = []
    version = [1]
    stop = threading.Event()

    def submit_all_along() -> None:
        i = 0
        while not stop.is_set():
            v = version[0]  # read once: the test switches it while this thread runs
            registry = NEW if v == 2 else OLD
            with engine.begin() as conn:
                run = submit_run(
                    conn,
                    registry,
                    "ver",
                    {"i": i},
                    key=f"r{i}",
                    version=v,
                    namespace=names.namespace,
                )
            submitted.append(run.run_id)
            i += 1
            stop.wait(0.02)

    def submitted_more(than: int) -> bool:
        return len(submitted) >= than

    feeder = threading.Thread(target=submit_all_along, daemon=True)
    with contextlib.ExitStack() as new_fleet:
        with contextlib.ExitStack() as old_fleet:
            old_fleet.enter_context(
                harness.running(
                    harness.scheduler(engine, database_url, OLD, names, advance=QUICK),
                    harness.agent(svc, names),
                )
            )
            feeder.start()
            harness.wait_for(lambda: submitted_more(20), what="v1 runs under way")
            new_fleet.enter_context(
                harness.running(
                    harness.scheduler(engine, database_url, NEW, names, advance=QUICK),
                    harness.agent(svc, names),
                )
            )
            harness.wait_for(lambda: submitted_more(40), what="more v1 runs")
            version[0] = 2
            count = len(submitted)
            harness.wait_for(lambda: submitted_more(count + 40), what="v2 runs beside the old")
        # The old scheduler and agent are stopped; submissions go on.
        count = len(submitted)
        harness.wait_for(lambda: submitted_more(count + 40), what="v2 runs after the old stop")
        stop.set()
        feeder.join(10)
        total = len(submitted)
        harness.wait_for(
            harness.all_runs_in(engine, {"completed"}, total),
            timeout=60,
            what=f"all {total} runs completed",
        )
    with engine.connect() as conn:
        by_version: dict[int, int] = dict(
            conn.execute(select(runs.c.version, func.count()).group_by(runs.c.version)).all()
        )
    assert set(by_version) == {1, 2}
    assert sum(by_version.values()) == total
