"""The rolling deploy of docs/howto/upgrade.md, step by step, under a continuous submission
load, on the real services: old schedulers (workflow `roll` v1 only) and old agent processes
(without the action `fresh`), then new schedulers (v1 and v2, whose step b runs `fresh`) and
new agent processes beside them, submissions switched to v1 and v2, then the old schedulers
stopped, then the old agents. No run fails: both halves of a mixed fleet hand their share on
(a scheduler without v2 leaves the run to one that has it, an agent without `fresh` hands the
request back), and every handler's effect happens once."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from sasflow import Registry, Step, StepContext, StepPolicy, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.scheduler import Scheduler
from sasflow.scheduler.advancing import AdvanceOptions
from sasflow.scheduler.cluster.member import ClusterOptions
from sasflow.states import StepState
from sasflow.store.schema import alerts, runs, steps
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

POLICY = StepPolicy(timeout=10)
QUICK = AdvanceOptions(interval=0.1)
HANDOVER = "left to a scheduler's advance duty: workflow 'roll' v2 is not loaded"
"""What an old scheduler logs when it leaves a v2 run to a new one (store.runs.advance)."""
EACH_PHASE = 25
"""Runs submitted in each phase of the deploy (at most one every 20 ms)."""


def _from_a(ctx: StepContext) -> Any:
    return {"a": ctx.outputs["a"]}


V1 = Workflow("roll", [Step("a", "roll", "go", policy=POLICY), Step("b", "roll", "go")], version=1)
V2 = Workflow(
    "roll",
    [
        Step("a", "roll", "go", policy=POLICY),
        Step("b", "roll", "fresh", input=_from_a, policy=POLICY),
    ],
    version=2,
)


@dataclass
class Effects:
    """The handlers' effects, counted per idempotency key (a step's, stable across attempts)."""

    counts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, call: Call) -> None:
        with self.lock:
            self.counts[call.idempotency_key] += 1


def _builds(effects: Effects) -> tuple[Agent, Agent]:
    """Agent `roll` before the release (`go`) and in it (`go` and the new `fresh`)."""
    old, new = Agent("roll"), Agent("roll")

    @old.handler("go")
    @new.handler("go")
    def go(call: Call) -> dict[str, Any]:
        effects.record(call)
        return {"go": call.input}

    @new.handler("fresh")
    def fresh(call: Call) -> dict[str, Any]:
        effects.record(call)
        return {"fresh": call.input}

    return old, new


@dataclass
class Feed:
    """Submits runs all along, as the applications calling `submit_run` would."""

    engine: Engine
    names: Names
    registry: Registry
    versions: tuple[int, ...] = (1,)
    submitted: list[tuple[int, int, str]] = field(default_factory=list)
    """(run id, version, deploy phase) of each run submitted."""
    phase: str = "old fleet"
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        for i in itertools.count():
            if self.stop.is_set():
                return
            registry, versions, phase = self.registry, self.versions, self.phase
            version = versions[i % len(versions)]
            with self.engine.begin() as conn:
                run = submit_run(
                    conn,
                    registry,
                    "roll",
                    {"i": i},
                    key=f"r{i}",
                    version=version,
                    namespace=self.names.namespace,
                )
            self.submitted.append((run.run_id, version, phase))
            self.stop.wait(0.02)

    def switch(self, phase: str, registry: Registry | None = None, *versions: int) -> None:
        """Enter `phase` once EACH_PHASE runs of the current one are submitted."""
        count = len(self.submitted)
        harness.wait_for(
            lambda: len(self.submitted) >= count + EACH_PHASE,
            what=f"{EACH_PHASE} runs submitted in phase {self.phase!r}",
        )
        if registry is not None:
            self.registry, self.versions = registry, versions
        self.phase = phase


def test_a_rolling_deploy_of_schedulers_and_agents_under_load_fails_no_run(
    engine: Engine, database_url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sasflow.store.runs.advance")
    effects = Effects()
    old_agent, new_agent = _builds(effects)
    old_app, new_app = Registry([V1], [old_agent]), Registry([V1, V2], [new_agent])
    old_agents = [harness.agent(old_agent, names, concurrency=2) for _ in range(2)]
    new_agents = [harness.agent(new_agent, names, concurrency=2) for _ in range(2)]

    def schedulers(release: str, app: Registry) -> list[Scheduler]:
        return [
            harness.scheduler(
                engine,
                database_url,
                app,
                names,
                rescan_interval=0.2,
                advance=QUICK,
                cluster=ClusterOptions(name=f"sched-{release}-{i}"),
            )
            for i in (1, 2)
        ]

    feed = Feed(engine, names, old_app)
    feeder = threading.Thread(target=feed.run, daemon=True)
    started = time.monotonic()
    with contextlib.ExitStack() as new_fleet:
        with harness.running(*old_agents):
            with harness.running(*schedulers("old", old_app)):
                feeder.start()
                feed.switch("database migrated")
                # Step 2: migrate the database first (here it is at head already: a no-op).
                harness.cli(database_url, names, "tests.apps.basic", expect=0)("db", "upgrade")
                feed.switch("new schedulers")
                # Step 3: the new schedulers beside the old ones.
                new_fleet.enter_context(harness.running(*schedulers("new", new_app)))
                feed.switch("new agents")
                # Step 4: the new agents, before any v2 run is submitted.
                new_fleet.enter_context(harness.running(*new_agents))
                harness.wait_for(
                    lambda: harness.consumers(names.agent("roll")) == 4, what="4 agent processes"
                )
                # Step 5: the submitters switch to the new release: v1 and v2.
                feed.switch("submitters switched", new_app, 1, 2)
                feed.switch("old schedulers stopping")
            # Step 6: the old schedulers stopped (as SIGTERM does), then the old agents.
            feed.switch("old agents stopping")
        feed.switch("new fleet alone")
        feed.switch("done")
        feed.stop.set()
        feeder.join(10)
        total = len(feed.submitted)
        harness.wait_for(
            harness.all_runs_in(engine, {"completed", "error"}, total),
            timeout=30,
            what=f"all {total} runs finished",
        )
    elapsed = time.monotonic() - started

    # Every run of both versions completed; no step failed or counted a failure.
    assert Counter(harness.run_states(engine).values()) == {"completed": total}
    rows = harness.step_rows(engine)
    assert {r.state for r in rows} == {StepState.PROCESSED}
    assert sum(r.failure_count for r in rows) == 0
    # Each handler's effect happened once per step: no step ran twice, none was skipped.
    assert effects.counts == dict.fromkeys((r.idempotency_key for r in rows), 1)
    # v2's step b ran the new action with the input v2's builder made.
    with engine.connect() as conn:
        by_version: dict[int, int] = dict(
            conn.execute(select(runs.c.version, func.count()).group_by(runs.c.version)).all()
        )
        fresh_inputs = list(
            conn.execute(
                select(steps.c.input, steps.c.output).where(steps.c.action == "fresh")
            ).all()
        )
        version_missing = conn.execute(
            select(func.count()).where(alerts.c.kind == "version_missing")
        ).scalar_one()
    assert by_version[1] + by_version[2] == total
    assert len(fresh_inputs) == by_version[2]
    assert all(out == {"fresh": inp} and set(inp) == {"a"} for inp, out in fresh_inputs)
    assert version_missing == 0
    # Both halves of the mixed fleet were exercised: v2 runs while the old ones ran, old
    # schedulers leaving v2 runs to the new ones, old agents handing `fresh` back.
    mixed = [v for _, v, phase in feed.submitted if phase == "submitters switched"]
    assert 2 in mixed
    handovers = sum(HANDOVER in r.getMessage() for r in caplog.records)
    handed_back = sum(a.stats.handed_back for a in old_agents)
    deferred = sum(a.stats.deferred for a in old_agents)
    assert handovers > 0, "no old scheduler left a v2 run to a new one"
    assert handed_back > 0, "no old agent process got a request for `fresh`"
    assert sum(a.stats.replied_error + a.stats.replied_failed for a in old_agents) == 0
    print(
        f"\nrolling deploy: {total} runs ({by_version[1]} v1, {by_version[2]} v2) in "
        f"{elapsed:.1f} s, all completed; {handovers} hand-overs of a v2 run by an old "
        f"scheduler to the new ones; {handed_back} requests handed back and {deferred} "
        "deferred by old agents; "
        f"phases: {dict(Counter(phase for _, _, phase in feed.submitted))}"
    )
