"""The `long_steps` fault: runs whose one step works longer than the broker's consumer timeout
(tests/chaos/app.py: 15 s against 10 s), and what is checked about them after healing.

The broker closes a channel whose delivery stays unacknowledged past its `consumer_timeout`
and hands the delivery to another consumer. Agents told that timeout
(`SASFLOW_BROKER_CONSUMER_TIMEOUT`) acknowledge the request of a step whose budget is at least
half of it once the broker confirmed its `step.started` (sasflow.agents.acks); from then on the
step's heartbeat and execution clocks own its recovery. The fault submits LONG_RUNS such runs
and waits until their steps started: an agent acknowledges a long step some 50 ms after it
starts, and before that its request is as exposed to a broker restart as a short step's, so
the next fault does not begin in that window. The other faults then hit the long steps while
they work: an agent stopped or killed under one, the broker restarted, or frozen past the
consumer timeout (after which it closes every channel that held a delivery then).

Checked: every long run completed, and no attempt of a long step was executed twice. A broker
redelivery runs the same attempt again; a new attempt (after a heartbeat or execution timeout)
is the engine's recovery, answered by the remote's idempotency record. Reported: executions
and attempts per long step, completion time from the fault's start against the work, and the
channels the broker closed for its consumer timeout (counted in its log).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, func, or_, select
from sqlalchemy.exc import SQLAlchemyError

from sasflow.store.schema import runs, steps
from tests.chaos.app import CONSUMER_TIMEOUT, LONG_WORK, long_run
from tests.chaos.broker import Publisher
from tests.chaos.checks import Report
from tests.chaos.remote import RemoteCall
from tests.chaos.workload import Driver

LONG_RUNS = 3
"""Long runs each `long_steps` fault submits."""
START_TIMEOUT = 30.0
"""Seconds the fault waits for its long steps to start."""
TIMED_OUT = "has timed out waiting for delivery acknowledgement"
"""What RabbitMQ logs (as a warning) each time it closes a channel for its consumer timeout."""


def agent_environment(consumer_timeout: float, early_acks: bool) -> dict[str, str]:
    """What the processes are told of the broker's consumer timeout: its value, or with
    `early_acks` off 0 (none: every request is acknowledged after its reply)."""
    return {"SASFLOW_BROKER_CONSUMER_TIMEOUT": str(consumer_timeout if early_acks else 0)}


def submission(key: str) -> bytes:
    return json.dumps(
        {"workflow": long_run.name, "key": key, "input": {"hold": LONG_WORK}}
    ).encode()


class BrokerLogs:
    """Counts the consumer timeouts the nodes log from now on (their logs outlive restarts)."""

    def __init__(self, logs: Sequence[Path]) -> None:
        self.offsets = {log: log.stat().st_size if log.exists() else 0 for log in logs}

    def timeouts(self) -> int | None:
        """How many since; None if a log could not be read."""
        found = 0
        for log, offset in self.offsets.items():
            try:
                with log.open("rb") as handle:
                    handle.seek(offset)
                    found += handle.read().decode(errors="replace").count(TIMED_OUT)
            except OSError:
                return None
        return found


@dataclass(frozen=True)
class Batch:
    """One `long_steps` fault's runs."""

    started: float
    """Wall-clock time the fault began (the database clock is this machine's)."""
    keys: tuple[str, ...]


@dataclass(frozen=True)
class LongRow:
    """A long run and its step, as the state store has them after healing."""

    key: str
    state: str
    finished: float | None
    """Wall-clock time it completed."""
    step_id: int
    attempt: int


@dataclass
class LongSteps:
    """The fault's action (the injector's thread) and the check after healing."""

    engine: Engine
    driver: Driver
    seed: int
    logs: BrokerLogs
    batches: list[Batch] = field(default_factory=list)

    def inject(self, publisher: Publisher) -> str:
        began = time.time()
        tag = f"long-s{self.seed}-{len(self.batches)}"
        keys = [f"{tag}-{n}" for n in range(LONG_RUNS)]
        sent = tuple(k for k in keys if self.driver.submit_once(publisher, k, submission(k)))
        self.batches.append(Batch(began, sent))
        started = _wait_started(self.engine, sent, START_TIMEOUT)
        return (
            f"{len(sent)} runs of a {LONG_WORK:.0f}s step (consumer timeout "
            f"{CONSUMER_TIMEOUT:.0f}s), {started} started after {time.time() - began:.1f}s"
        )

    def check(self, report: Report, calls: Sequence[RemoteCall], told: float) -> None:
        """Add the long steps' lines and check to `report` (`told`: the consumer timeout the
        agents were given, 0 for none)."""
        keys = [key for batch in self.batches for key in batch.keys]
        rows = long_rows(self.engine, keys)
        judge(report, rows, calls, self.batches, timeouts=self.logs.timeouts(), told=told)


def _wait_started(engine: Engine, keys: Sequence[str], timeout: float) -> int:
    """Wait until the long steps of runs `keys` started (or finished); how many did."""
    deadline = time.monotonic() + timeout
    started = 0
    while keys and time.monotonic() < deadline:
        try:
            with engine.connect() as conn:
                started = conn.execute(
                    select(func.count())
                    .select_from(steps.join(runs, runs.c.id == steps.c.run_id))
                    .where(
                        runs.c.workflow == long_run.name,
                        runs.c.business_key.in_(keys),
                        or_(steps.c.started_at.is_not(None), steps.c.state == "processed"),
                    )
                ).scalar_one()
        except SQLAlchemyError:
            started = 0
        if started >= len(keys):
            break
        time.sleep(0.2)
    return started


def long_rows(engine: Engine, keys: Sequence[str]) -> list[LongRow]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                runs.c.business_key,
                runs.c.state,
                func.extract("epoch", runs.c.finished_at).label("finished"),
                steps.c.id,
                steps.c.attempt,
            )
            .join(steps, steps.c.run_id == runs.c.id)
            .where(runs.c.workflow == long_run.name, runs.c.business_key.in_(keys))
        ).all()
    return [
        LongRow(
            key=r.business_key,
            state=r.state,
            finished=None if r.finished is None else float(r.finished),
            step_id=r.id,
            attempt=r.attempt,
        )
        for r in rows
    ]


def _median_max(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.1f}/{max(values):.1f}s" if values else "-"


def judge(
    report: Report,
    rows: Sequence[LongRow],
    calls: Sequence[RemoteCall],
    batches: Sequence[Batch],
    *,
    timeouts: int | None,
    told: float,
) -> None:
    """The long steps' check: every long run completed, no attempt of a long step executed
    twice; with their figures (`report.figures["long_steps"]`). `timeouts`: the channels the
    broker closed for its consumer timeout (None: unknown); `told`: the consumer timeout the
    agents were given (0: none)."""
    submitted = {key: batch for batch in batches for key in batch.keys}
    by_key = {row.key: row for row in rows}
    ids = {row.step_id for row in rows}
    per_attempt = Counter((c.step_id, c.attempt) for c in calls if c.step_id in ids)
    per_step = Counter(c.step_id for c in calls if c.step_id in ids)
    twice = sorted(pair for pair, n in per_attempt.items() if n > 1)
    missing = sorted(set(submitted) - by_key.keys())
    unfinished = sorted(row.key for row in rows if row.state != "completed")
    completion = [
        row.finished - submitted[row.key].started
        for row in rows
        if row.finished is not None and row.key in submitted
    ]
    executions = Counter(per_step.get(row.step_id, 0) for row in rows)
    attempts = Counter(row.attempt for row in rows)
    report.lines.append(
        f"long steps: {len(rows)} runs of a {LONG_WORK:.0f}s step in {len(batches)} faults; "
        f"executions per step {dict(sorted(executions.items()))}, attempts per step "
        f"{dict(sorted(attempts.items()))}; completed {_median_max(completion)} "
        f"(median/max) after their fault's start"
    )
    report.lines.append(
        f"    consumer timeout: the broker's {CONSUMER_TIMEOUT:.0f}s, the agents told "
        f"{f'{told:.0f}s' if told else 'none (no early acknowledgement)'}; channels the broker "
        f"closed for it: {'unknown' if timeouts is None else timeouts}"
    )
    report.check(
        "long steps completed, no attempt executed twice",
        not missing and not unfinished and not twice,
        f"{len(missing)} not found {missing[:3]}, {len(unfinished)} not completed "
        f"{unfinished[:3]}, {len(twice)} attempts executed more than once (step, attempt) "
        f"{twice[:5]}",
    )
    report.figures["long_steps"] = {
        "runs": len(rows),
        "executed_twice": len(twice),
        "executions": dict(executions),
        "consumer_timeouts": timeouts,
    }
