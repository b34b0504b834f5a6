"""The sasflow benchmark suite: limits of this machine, then the engine against them.

    python bench/run.py [--quick] [--only W0,W1,W2,W3,sweep,recovery] [--repeat N]

Prints a machine line, then each figure as the median and min-max of its repeats, its ratio to
the W0 limits measured in the same run and, where the issue sets one, the target with PASS or
FALL SHORT. Everything runs on the real PostgreSQL and RabbitMQ of SASFLOW_DATABASE_URL and
SASFLOW_BROKER_URL (defaults: the local ones) at their production durability settings; every
scratch database and namespace is dropped and every process started is killed at the end.
`--quick` uses small sizes (about 2 minutes); the default sizes are the issue's.
See docs/performance.md for the method and results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pika
from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import apps, limits
from bench.sweep import measure as measure_sweep
from sasflow import Registry, Step, Workflow, submit_run
from sasflow.agents import Agent, Call
from sasflow.hooks import Hooks
from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import harness, services
from tests.acceptance.processes import Processes
from tests.apps import ops

WORKLOADS = ("W0", "W1", "W2", "W3", "sweep", "recovery")
SUBMIT_BATCH = 500
KILLABLE_DEADLINE = 3.0  # tests/apps/ops.py: killable's step timeout
SUPERVISOR_INTERVAL = 0.5


@dataclass
class Sizes:
    repeat: int
    w0_seconds: float
    w1_runs: int
    w2_runs: int
    w3_seconds: float
    w3_rate: float
    sweep_rows: list[int]
    drain_timeout: float

    @staticmethod
    def of(quick: bool) -> Sizes:
        if quick:
            return Sizes(1, 1.5, 1_000, 300, 5, 20, [100_000], 180)
        return Sizes(3, 4.0, 10_000, 2_000, 20, 20, [1_000_000, 100_000], 900)


@dataclass
class Results:
    figures: dict[str, list[float]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        values = self.figures.get(name)
        return statistics.median(values) if values else None


def say(line: str, results: Results | None = None) -> None:
    print(line, flush=True)
    if results is not None:
        results.lines.append(line)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


def report(
    results: Results,
    name: str,
    values: list[float],
    unit: str,
    extra: str = "",
    *,
    fmt: str = ".1f",
) -> None:
    results.figures[name] = values
    med = statistics.median(values)
    say(
        f"  {name:<34} {med:>10{fmt}} {unit:<8} (min {min(values):{fmt}}, max "
        f"{max(values):{fmt}}, n={len(values)}){'  ' + extra if extra else ''}",
        results,
    )


# ----------------------------------------------------------------------------- machine line


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _rabbitmq_version() -> str:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return "unknown (no rabbitmqctl)"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(  # noqa: S603 - a fixed argv, rabbitmqctl found on PATH
            [ctl, "version"], capture_output=True, text=True, timeout=30, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
    return "unknown"


def machine_line() -> str:
    admin = make_engine(services.admin_url())
    try:
        with admin.connect() as conn:
            pg = str(conn.execute(text("SHOW server_version")).scalar())
            settings = {
                name: str(conn.execute(text(f"SHOW {name}")).scalar())
                for name in ("fsync", "synchronous_commit")
            }
    finally:
        admin.dispose()
    packages = ", ".join(f"{p} {metadata.version(p)}" for p in ("sqlalchemy", "psycopg", "pika"))
    return (
        f"machine: {os.cpu_count()} cores, {_cpu_model()}; PostgreSQL {pg} "
        f"(fsync={settings['fsync']}, synchronous_commit={settings['synchronous_commit']}); "
        f"RabbitMQ {_rabbitmq_version()}; Python {platform.python_version()}; {packages}"
    )


def load_line() -> str:
    """The machine's load averages: the figures of a shared machine are only as quiet as this."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min)"


# ----------------------------------------------------------------------------- scratch services


@contextlib.contextmanager
def scratch(prefix: str, agents: list[str]) -> Iterator[tuple[str, Engine, Names]]:
    """A migrated scratch database and a namespace, both dropped on exit whatever happens."""
    database = services.unique(f"sasflow_bench_{prefix}")
    names = Names(services.unique(f"sfbench{prefix}"))
    services.create_database(database)
    url = services.database_url(database)
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        yield url, engine, names
    finally:
        engine.dispose()
        services.drop_database(database)
        services.delete_namespace(names.namespace, names.all_queues(agents))


@contextlib.contextmanager
def processes(url: str, names: Names, app: str) -> Iterator[Processes]:
    with tempfile.TemporaryDirectory(prefix="sasflow-bench-") as logs:
        procs = Processes(Path(logs), database_url=url, namespace=names.namespace, app=app)
        try:
            yield procs
        finally:
            procs.stop_all()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ----------------------------------------------------------------------------- W0


def run_w0(sizes: Sizes, results: Results) -> None:
    say("W0 limits (this machine, same run)", results)
    seconds = sizes.w0_seconds
    with scratch("w0", []) as (_url, engine, names):
        report(
            results,
            "W0 update tx/s",
            [limits.update_rate(engine, seconds) for _ in range(sizes.repeat)],
            "tx/s",
        )
        for claimers in (1, 2, 4):
            for batch in (1, 50):
                report(
                    results,
                    f"W0 claim {claimers} thr x batch {batch}",
                    [
                        limits.claim_rate(engine, claimers, batch, seconds)
                        for _ in range(sizes.repeat)
                    ],
                    "claims/s",
                )
        for in_flight in (1, 8):
            report(
                results,
                f"W0 rabbitmq rr {in_flight} in flight",
                [
                    limits.roundtrip_rate(names.namespace, in_flight, seconds)
                    for _ in range(sizes.repeat)
                ],
                "rt/s",
            )


# ----------------------------------------------------------------------------- W1 / W2


def submit_up_front(
    engine: Engine, workflow: str, count: int, prefix: str, namespace: str
) -> tuple[float, float]:
    """Submit `count` runs with submit_run, in batches of SUBMIT_BATCH statements, all in one
    transaction so that the whole backlog becomes visible at once. Returns the seconds the
    submission took and the database clock just after the commit (epoch seconds)."""
    started = time.perf_counter()
    with engine.begin() as conn:
        for first in range(0, count, SUBMIT_BATCH):
            for i in range(first, min(count, first + SUBMIT_BATCH)):
                submit_run(
                    conn, apps.registry, workflow, {"i": i}, key=f"{prefix}{i}", namespace=namespace
                )
    with engine.connect() as conn:
        committed = float(
            conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one()
        )
    return time.perf_counter() - started, committed


def completed(engine: Engine, prefix: str) -> tuple[int, float]:
    """Runs of `prefix` completed, and the latest completion (epoch seconds, database clock)."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*), coalesce(extract(epoch FROM max(finished_at)), 0) FROM runs "
                "WHERE business_key LIKE :p AND state = 'completed'"
            ),
            {"p": f"{prefix}%"},
        ).one()
    return int(row[0]), float(row[1])


def drain(
    url: str,
    engine: Engine,
    names: Names,
    workflow: str,
    *,
    count: int,
    label: str,
    sizes: Sizes,
    memory: dict[str, list[float]] | None,
    cpu: list[float] | None = None,
) -> float:
    """Start 2 agents and 2 schedulers (CLI processes), let them settle, submit `count` runs
    in one transaction and time the drain from that commit to the last run's completion
    (both on the database clock); returns runs completed/s. `cpu` receives the CPU
    milliseconds the four processes spent per run during the drain."""
    prefix = f"{label}-{time.time_ns()}-"
    with processes(url, names, "bench.apps") as procs:
        agents = [procs.start(f"agent-{i}", "agent", "noop") for i in (1, 2)]
        time.sleep(1.5)  # the agents declare their queue before the schedulers publish to it
        schedulers = [procs.start(f"scheduler-{i}", "scheduler") for i in (1, 2)]
        time.sleep(2.5)
        procs.assert_alive()
        roles = [*agents, *schedulers]
        cpu_before = sum(cpu_seconds(p.pid) for p in roles)
        took, committed = submit_up_front(engine, workflow, count, prefix, names.namespace)
        say(f"    submitted {count:,} {workflow} runs in one transaction in {took:.1f}s")
        waited = time.monotonic()
        finished = wait_until(
            lambda: completed(engine, prefix)[0] >= count, sizes.drain_timeout, interval=0.1
        )
        procs.assert_alive()
        if cpu is not None:
            cpu.append((sum(cpu_seconds(p.pid) for p in roles) - cpu_before) * 1000 / count)
        if memory is not None:
            memory.setdefault("scheduler", []).append(max(peak_rss_mb(p.pid) for p in schedulers))
            memory.setdefault("agent", []).append(max(peak_rss_mb(p.pid) for p in agents))
    done, last = completed(engine, prefix)
    if not finished:
        say(f"    only {done:,}/{count:,} completed within {sizes.drain_timeout:g}s")
        return done / max(1e-9, time.monotonic() - waited)
    return done / max(last - committed, 1e-9)


def run_w12(sizes: Sizes, results: Results, which: set[str]) -> None:
    rr8 = results.median("W0 rabbitmq rr 8 in flight")
    with scratch("w12", ["noop"]) as (url, engine, names):
        if "W1" in which:
            say(
                f"W1: {sizes.w1_runs:,} one-step runs submitted up front (one commit), drained by "
                "2 schedulers + 2 agents (CLI processes)",
                results,
            )
            memory: dict[str, list[float]] = {}
            rates = [
                drain(
                    url,
                    engine,
                    names,
                    "one",
                    count=sizes.w1_runs,
                    label="w1",
                    sizes=sizes,
                    memory=memory,
                )
                for _ in range(sizes.repeat)
            ]
            extra = ""
            if rr8:
                ratio = statistics.median(rates) / rr8
                extra = (
                    f"= {ratio:.0%} of rr8 ({rr8:.0f}/s); target >= 40%: {verdict(ratio >= 0.40)}"
                )
            report(results, "W1 one-step runs/s", rates, "runs/s", extra)
            report(
                results,
                "W1 scheduler peak RSS",
                memory["scheduler"],
                "MB",
                f"target <= 150 MB: {verdict(max(memory['scheduler']) <= 150)}",
            )
            report(results, "W1 agent peak RSS", memory["agent"], "MB")
        if "W2" in which:
            say(f"W2: {sizes.w2_runs:,} three-step sequential runs, same set-up", results)
            rates = [
                drain(
                    url,
                    engine,
                    names,
                    "three",
                    count=sizes.w2_runs,
                    label="w2",
                    sizes=sizes,
                    memory=None,
                )
                for _ in range(sizes.repeat)
            ]
            extra = ""
            if rr8:
                ratio = statistics.median(rates) / (rr8 / 3)
                extra = (
                    f"= {ratio:.0%} of rr8/3 ({rr8 / 3:.0f}/s); target >= 40%: "
                    f"{verdict(ratio >= 0.40)}"
                )
            report(results, "W2 three-step runs/s", rates, "runs/s", extra)


# ----------------------------------------------------------------------------- W3


def build_registry() -> tuple[Registry, Agent]:
    noop = Agent("noop")

    @noop.handler("nothing")
    def nothing(_call: Call) -> None:
        return None

    return Registry([Workflow("one", [Step("only", "noop", "nothing")])], [noop]), noop


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_once(
    sizes: Sizes, hooks: Callable[[str], Hooks | None] = lambda _role: None
) -> list[float]:
    """bench/latency.py's measurement: submit-commit to `run.completed` notification, ms;
    `hooks(role)` gives the scheduler's and the agent's hooks (bench/overhead.py)."""
    registry, agent = build_registry()
    runs = int(sizes.w3_seconds * sizes.w3_rate)
    with scratch("w3", ["noop"]) as (url, engine, names):
        queue = harness.bind_status_queue(names, "one.run.completed")
        completions: dict[int, float] = {}
        submitted: dict[int, float] = {}
        done = threading.Event()

        def listen() -> None:
            connection = pika.BlockingConnection(pika.URLParameters(services.broker_url()))
            channel = connection.channel()
            for _method, _props, body in channel.consume(
                queue, auto_ack=True, inactivity_timeout=0.05
            ):
                if body is not None:
                    completions[json.loads(body)["run_id"]] = time.perf_counter()
                if done.is_set():
                    break
            connection.close()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        try:
            with harness.running(
                harness.scheduler(engine, url, registry, names, hooks("scheduler")),
                harness.agent(agent, names, hooks=hooks("agent")),
            ):
                time.sleep(1.0)
                for i in range(runs):
                    started = time.perf_counter()
                    with engine.begin() as conn:
                        run = submit_run(
                            conn, registry, "one", {"i": i}, key=f"r{i}", namespace=names.namespace
                        )
                    submitted[run.run_id] = started
                    time.sleep(max(0.0, 1 / sizes.w3_rate - (time.perf_counter() - started)))
                wait_until(lambda: len(completions) >= runs, 30)
        finally:
            done.set()
            listener.join(5)
    latencies = [(completions[r] - submitted[r]) * 1000 for r in submitted if r in completions]
    if len(latencies) < runs:
        say(f"    only {len(latencies)}/{runs} completions observed")
    return latencies


def run_w3(sizes: Sizes, results: Results) -> None:
    say(
        f"W3: one one-step run at a time at {sizes.w3_rate:g}/s for {sizes.w3_seconds:g}s, "
        "submit commit -> run.completed notification (scheduler + agent threads)",
        results,
    )
    p50s, p95s, p99s = [], [], []
    for _ in range(sizes.repeat):
        latencies = latency_once(sizes)
        p50s.append(statistics.median(latencies))
        p95s.append(percentile(latencies, 0.95))
        p99s.append(percentile(latencies, 0.99))
    rr1 = results.median("W0 rabbitmq rr 1 in flight")
    rt = f"= {statistics.median(p50s) * rr1 / 1000:.1f} rr1 round trips; " if rr1 else ""
    report(
        results,
        "W3 latency p50",
        p50s,
        "ms",
        f"{rt}target <= 5 ms: {verdict(statistics.median(p50s) <= 5)}",
    )
    report(results, "W3 latency p95", p95s, "ms")
    report(
        results,
        "W3 latency p99",
        p99s,
        "ms",
        f"target <= 20 ms: {verdict(statistics.median(p99s) <= 20)}",
    )


# ----------------------------------------------------------------------------- sweep


def run_sweep(sizes: Sizes, results: Results) -> None:
    tables = ", ".join(f"{r:,}" for r in sizes.sweep_rows)
    say(
        f"Sweep: supervisor sweep of 1,000 expired steps ({tables} step rows), "
        "bench/sweep.py's measure()",
        results,
    )
    for rows in sizes.sweep_rows:
        timings = [t * 1000 for t in measure_sweep(rows, 1000, sizes.repeat)]
        results.figures[f"sweep {rows:,} rows"] = timings
    big, small = results.median("sweep 1,000,000 rows"), results.median("sweep 100,000 rows")
    for rows in sizes.sweep_rows:
        name = f"sweep {rows:,} rows"
        extra = ""
        if rows == 1_000_000 and big is not None:
            extra = f"target <= 100 ms: {verdict(big <= 100)}"
            if small:
                extra += (
                    f"; {big / small:.2f}x the 100k figure, target <= 2x: "
                    f"{verdict(big <= 2 * small)}"
                )
        report(results, name, results.figures[name], "ms", extra)


# ----------------------------------------------------------------------------- recovery


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


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)}",
    )
    parser.add_argument("--repeat", type=int, default=None, help="override the repeat count")
    args = parser.parse_args()
    which = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = which - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {WORKLOADS}")
    sizes = Sizes.of(args.quick)
    if args.repeat is not None:
        sizes.repeat = max(1, args.repeat)
    results = Results()
    began = time.monotonic()
    say(machine_line(), results)
    say(
        f"mode: {'quick' if args.quick else 'full'}, {sizes.repeat} repeat(s); "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {load_line()}",
        results,
    )
    if "W0" in which:
        run_w0(sizes, results)
    if which & {"W1", "W2"}:
        run_w12(sizes, results, which)
    if "W3" in which:
        run_w3(sizes, results)
    if "sweep" in which:
        run_sweep(sizes, results)
    if "recovery" in which:
        run_recovery(sizes, results)
    say(f"done in {time.monotonic() - began:.0f}s; {load_line()}", results)


if __name__ == "__main__":
    main()
