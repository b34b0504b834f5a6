"""Draining W1/W2 runs with the roles as CLI processes, timed on the database clock.

2 agents (`sasflow agent noop`, default concurrency 4) and 2 schedulers (`sasflow scheduler`)
start and settle, plus a `sasflow submitter` for the broker form; then a form of
bench/workloads/submit.py submits the runs while they drain. The drain's window runs from the
form's start (database clock) to the last run's `finished_at`; the CPU each role's processes
spent (utime + stime of /proc/PID/stat, summed over the processes of the role) is taken over
the same window, from just before the submission starts until every run completed.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from bench.common import Sizes, analyze, autovacuum, cpu_seconds, peak_rss_mb, processes, wait_until
from bench.report import say
from bench.workloads.submit import Broker, Concurrent, Form, UpFront, runs_after
from sasflow.transport.topology import Names
from tests.acceptance.processes import Processes

FORMS = ("up-front", "concurrent", "broker")
STEPS = {"one": 1, "three": 3}
AGENT_SETTLE = 1.5
"""Seconds for the agents to declare their queue before the schedulers publish to it."""
ROLE_SETTLE = 2.5
OUTSTANDING = (
    "SELECT count(*) FROM runs WHERE id > :f AND state IN ('pending', 'running', 'compensating')"
)


@dataclass
class Drain:
    count: int
    done: int
    steps: int
    rate: float
    """Runs completed per second over the window."""
    submit_rate: float
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds per role over the window."""
    memory: dict[str, float] = field(default_factory=dict)
    """Peak RSS (MB) of the largest process of each role."""
    client_cpu_ms: float | None = None

    def cpu_ms(self, role: str, per: int) -> float:
        return self.cpu.get(role, float("nan")) * 1000 / max(per, 1)


def start_roles(procs: Processes, *, submitter: bool) -> dict[str, list[subprocess.Popen[bytes]]]:
    agents = [procs.start(f"agent-{i}", "agent", "noop") for i in (1, 2)]
    time.sleep(AGENT_SETTLE)
    roles = {
        "agent": agents,
        "scheduler": [procs.start(f"scheduler-{i}", "scheduler") for i in (1, 2)],
    }
    if submitter:
        roles["submitter"] = [procs.start("submitter", "submitter")]
    time.sleep(ROLE_SETTLE)
    procs.assert_alive()
    return roles


def _cpu(roles: dict[str, list[subprocess.Popen[bytes]]]) -> dict[str, float]:
    return {role: sum(cpu_seconds(p.pid) for p in started) for role, started in roles.items()}


def _floor(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT coalesce(max(id), 0) FROM runs")).scalar_one())


def _drained(engine: Engine, floor: int) -> bool:
    """No run above `floor` is left unfinished (cheap: the state index holds only those)."""
    with engine.connect() as conn:
        return int(conn.execute(text(OUTSTANDING), {"f": floor}).scalar_one()) == 0


def make_form(
    form: str, engine: Engine, names: Names, workflow: str, count: int, *, sizes: Sizes
) -> tuple[Form, int]:
    floor = _floor(engine)
    prefix = f"{form}-{time.time_ns()}-"
    if form == "up-front":
        return UpFront(
            engine, names, workflow, count, prefix, analyze_tables=not autovacuum(engine)
        ), floor
    if form == "concurrent":
        return Concurrent(
            engine, workflow, count, prefix, clients=sizes.clients, floor=floor
        ), floor
    if form == "broker":
        return Broker(engine, names, workflow, count, prefix, floor=floor), floor
    raise ValueError(f"unknown form {form!r}; choose from {FORMS}")


def drain(
    url: str, engine: Engine, names: Names, workflow: str, *, count: int, form: str, sizes: Sizes
) -> Drain:
    """Start the roles, submit `count` runs of `workflow` the `form` way while they drain,
    and measure the drain (runs/s from the form's start to the last `finished_at`)."""
    submitting, floor = make_form(form, engine, names, workflow, count, sizes=sizes)
    with processes(url, names, "bench.apps") as procs:
        roles = start_roles(procs, submitter=form == "broker")
        try:
            submitting.prepare(procs)
            if form != "up-front" and not autovacuum(engine):
                with engine.begin() as conn:
                    took = analyze(conn)
                say(
                    f"    ANALYZE before the form (autovacuum off; {floor:,} runs so far): "
                    f"{took * 1000:.0f} ms"
                )
            before = _cpu(roles)
            waited = time.monotonic()
            submitting.start()
            submitted = submitting.finish(sizes.drain_timeout)
            say(f"    {submitted.note}")
            finished = wait_until(
                lambda: _drained(engine, floor), sizes.drain_timeout, interval=0.1
            )
            after = _cpu(roles)
            procs.assert_alive()
            memory = {r: max(peak_rss_mb(p.pid) for p in started) for r, started in roles.items()}
        finally:
            submitting.close()
    recorded, done, _, last = runs_after(engine, floor)
    steps = done * STEPS[workflow]
    if finished and done == count:
        rate = done / max(last - submitted.start, 1e-9)
    else:
        say(
            f"    only {done:,}/{count:,} completed ({recorded:,} recorded) within "
            f"{sizes.drain_timeout:g}s"
        )
        rate = done / max(1e-9, time.monotonic() - waited)
    return Drain(
        count,
        done,
        steps,
        rate,
        submitted.rate,
        {role: after[role] - before[role] for role in roles},
        memory,
        submitted.cpu_ms,
    )
