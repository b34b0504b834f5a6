"""Profiles of the role processes under W1 and W3 (py-spy), and their top functions.

    python bench/profile.py [--runs 5000] [--rate 20] [--seconds 20] [--out DIR]

On a scratch database and namespace (real PostgreSQL and RabbitMQ), with 2 schedulers, 2
agents (`noop`) and a submitter as CLI processes:
- W1: `--runs` one-step runs published to `<ns>.submit` (confirmed, in batches of 500), recorded
  by the submitter and drained by the schedulers and agents;
- W3: one one-step run at a time at `--rate` per second for `--seconds`, each submitted with
  `submit_run` in its own transaction (the submitter idles).
py-spy samples one scheduler, one agent and the submitter during each workload (non-idle
samples only, so waiting in a socket read is not counted, a busy wait is) and writes a flame
graph (SVG) and the raw stacks of each to `--out`; then it prints, per process, the functions
with the largest share of samples: "total" counts a sample when the function is anywhere on the
stack, "self" when it is the leaf. Needs py-spy (in the `dev` extra) and the right to
ptrace the processes (root, or `kernel.yama.ptrace_scope=0`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, text

from bench import apps
from bench.common import processes, publish_submissions, scratch, wait_until
from sasflow import submit_run
from sasflow.transport.topology import Names, declare_common
from tests import harness

TOP = 14
LEAVES = 8


def finished(engine: Engine, prefix: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM runs WHERE business_key LIKE :p AND state='completed'"),
                {"p": f"{prefix}%"},
            ).scalar_one()
        )


def spy(pid: int, out: Path, fmt: str, *, gil: bool) -> subprocess.Popen[bytes]:
    """py-spy recording `pid` until it is interrupted, as `fmt` (raw stacks or an SVG flame
    graph)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen(  # noqa: S603 - our own arguments
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "100",
            "--format",
            "raw" if fmt == "raw" else "flamegraph",
            "-o",
            str(out),
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_spies(spies: list[subprocess.Popen[bytes]]) -> None:
    for proc in spies:
        proc.send_signal(signal.SIGINT)
    for proc in spies:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def top_functions(raw: Path) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's raw (collapsed) output: the samples, sasflow's own functions by their
    share of samples anywhere on the stack ("total"), and every function by its share as the
    leaf ("self"), largest first."""
    total: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        samples += count
        frames = [_name(frame) for frame in stack.split(";") if frame]
        for name in {f for f in frames if f.endswith(")") and "(sasflow/" in f}:
            total[name] += count
        if frames:
            leaf[frames[-1]] += count
    share = 100 / max(1, samples)
    return (
        samples,
        [(name, n * share) for name, n in total.most_common()],
        [(name, n * share) for name, n in leaf.most_common()],
    )


def _name(frame: str) -> str:
    """`f (sasflow/scheduler/loop.py:200)` -> `f (sasflow/scheduler/loop.py)`."""
    return re.sub(r":\d+\)$", ")", frame)


def print_profile(label: str, raw: Path) -> None:
    if not raw.exists():
        print(f"  {label}: no profile (py-spy could not attach?)")
        return
    samples, totals, leaves = top_functions(raw)
    print(f"  {label}: {samples:,} non-idle samples")
    print("    sasflow functions, share of samples with the function on the stack:")
    for name, pct in totals[:TOP]:
        print(f"      {pct:5.1f}%  {name}")
    print("    leaves, share of samples spent in the function itself:")
    for name, pct in leaves[:LEAVES]:
        print(f"      {pct:5.1f}%  {name}")


def profile_w1(url: str, engine: Engine, names: Names, *, runs: int, out: Path, gil: bool) -> None:
    publisher = harness.transport("bench-profile")
    publisher.connect()
    try:
        declare_common(publisher, names)
        with processes(url, names, "bench.apps") as procs:
            agents = [procs.start(f"agent-{i}", "agent", "noop") for i in (1, 2)]
            time.sleep(1.5)
            schedulers = [procs.start(f"scheduler-{i}", "scheduler") for i in (1, 2)]
            submitter = procs.start("submitter", "submitter")
            time.sleep(2.5)
            procs.assert_alive()
            targets = {"scheduler": schedulers[0], "agent": agents[0], "submitter": submitter}
            spies = [
                spy(p.pid, out / f"w1-{role}.{fmt}", fmt, gil=gil)
                for role, p in targets.items()
                for fmt in ("raw", "svg")
            ]
            time.sleep(1)
            started = time.perf_counter()
            publish_submissions(publisher, names, workflow="one", runs=runs, prefix="w1p")
            done = wait_until(lambda: finished(engine, "w1p") >= runs, 600, interval=0.1)
            took = time.perf_counter() - started
            stop_spies(spies)
            procs.assert_alive()
    finally:
        publisher.close()
    print(f"W1: {runs:,} runs through <ns>.submit, {'all' if done else 'NOT all'} completed")
    print(f"  {runs / took:.0f} runs/s while profiled (py-spy slows what it samples)")
    for role in targets:
        print_profile(f"W1 {role}", out / f"w1-{role}.raw")


def profile_w3(
    url: str, engine: Engine, names: Names, *, rate: float, seconds: float, out: Path, gil: bool
) -> None:
    with processes(url, names, "bench.apps") as procs:
        agent = procs.start("agent-1", "agent", "noop")
        time.sleep(1.5)
        scheduler = procs.start("scheduler-1", "scheduler")
        time.sleep(2.5)
        procs.assert_alive()
        targets = {"scheduler": scheduler, "agent": agent}
        spies = [
            spy(p.pid, out / f"w3-{role}.{fmt}", fmt, gil=gil)
            for role, p in targets.items()
            for fmt in ("raw", "svg")
        ]
        time.sleep(1)
        count = int(rate * seconds)
        for i in range(count):
            with engine.begin() as conn:
                submit_run(
                    conn, apps.registry, "one", {"i": i}, key=f"w3p{i}", namespace=names.namespace
                )
            time.sleep(1 / rate)
        done = wait_until(lambda: finished(engine, "w3p") >= count, 60, interval=0.1)
        stop_spies(spies)
        procs.assert_alive()
    print(f"W3: {count} runs one at a time at {rate:g}/s, {'all' if done else 'NOT all'} completed")
    for role in targets:
        print_profile(f"W3 {role}", out / f"w3-{role}.raw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5000, help="W1 runs")
    parser.add_argument("--rate", type=float, default=20.0, help="W3 runs per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="W3 duration")
    parser.add_argument("--out", type=Path, default=Path("profiles"), help="output directory")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (Python CPU work; waits are not counted)",
    )
    parser.add_argument("--only", default="W1,W3", help="W1, W3 or both")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    which = {w.strip().upper() for w in args.only.split(",")}
    if "W1" in which:
        with scratch("prof1", ["noop"]) as (url, engine, names):
            profile_w1(url, engine, names, runs=args.runs, out=args.out, gil=args.gil)
    if "W3" in which:
        with scratch("prof3", ["noop"]) as (url, engine, names):
            profile_w3(
                url, engine, names, rate=args.rate, seconds=args.seconds, out=args.out, gil=args.gil
            )
    print(f"flame graphs and raw stacks in {args.out}/")


if __name__ == "__main__":
    main()
