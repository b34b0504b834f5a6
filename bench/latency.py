"""Submit-to-completion latency of one-step runs, one at a time (W3 of bench/run.py alone).

    python bench/latency.py [--runs 200] [--rate 20] [--schedulers 1] [--submitter] [--stages]

Starts a scheduler and an agent (threads of this process, real PostgreSQL and RabbitMQ, a
scratch database and namespace), submits one run at a time in its own transaction at `--rate`
runs/s, and times each from just before the submitting transaction to the arrival of its
`run.completed` status event ("observed") and to the start of its step's handler ("body").
Prints p50, p95 and p99 of each in milliseconds, and how many runs were observed more than
0.5 s after submission. `--schedulers 2 --submitter` relays with issue 26's three relays (two
schedulers and a submitter, all relaying events; the runs are still submitted by the bench).
`--stages` also prints the median time between the stages of one run's path (bench/stages.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Sizes
from bench.report import percentile
from bench.stages import Stages
from bench.workloads.w3 import latency_once

SLOW_MS = 500.0
"""A run observed later than this waited for a periodic pass (issue 26's tail)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument("--submitter", action="store_true", help="a submitter relays too")
    parser.add_argument(
        "--stages", action="store_true", help="print the median time between stages of the path"
    )
    args = parser.parse_args()
    stages = Stages() if args.stages else None
    sizes = dataclasses.replace(
        Sizes.of(quick=True), w3_seconds=args.runs / args.rate, w3_rate=args.rate
    )
    measured = latency_once(
        sizes, schedulers=args.schedulers, submitter=args.submitter, stages=stages
    )
    for kind, values, what in (
        ("observed", measured.observed, "submit -> run.completed status event"),
        ("body", measured.body, "submit -> the step's handler starts"),
    ):
        print(
            f"{kind}: {len(values)}/{args.runs} one-step runs at {args.rate:g}/s: "
            f"p50 {statistics.median(values):.1f} ms, p95 {percentile(values, 0.95):.1f} "
            f"ms, p99 {percentile(values, 0.99):.1f} ms, "
            f"{sum(v > SLOW_MS for v in values)} over {SLOW_MS:g} ms ({what})"
        )
    if stages is not None:
        print(stages.table())


if __name__ == "__main__":
    main()
