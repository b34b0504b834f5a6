"""The sasflow benchmark suite: limits of this machine, then the engine against them.

    python bench/run.py [--quick] [--only W0,W1,W1c,W1s,W2,W2c,W3,sweep,recovery,ratelimit]
                        [--repeat N] [--flow-limits none|other|generous]
    python bench/run.py [--quick] --only overload


Prints a machine line, then each figure as the median and min-max of its repeats, its ratio to
the W0 limits measured in the same run and, where issue 11 sets one, the target with PASS or
FALL SHORT. Everything runs on the real PostgreSQL and RabbitMQ of SASFLOW_DATABASE_URL and
SASFLOW_BROKER_URL (defaults: the local ones) at their production durability settings; every
scratch database and namespace is dropped and every process started is killed at the end.
`--quick` uses small sizes (about 2-3 minutes); the default sizes are the issue's.
The workloads live in bench/workloads/; see docs/performance.md for the method and results.
`overload` (the flow-control acceptance instrument, about 10 minutes; `--quick` about 3) runs
only when named.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Sizes
from bench.report import Results, load_line, machine_line, say
from bench.workloads.overload import run_overload
from bench.workloads.ratelimit import run_ratelimit
from bench.workloads.recovery import run_recovery
from bench.workloads.sweep import run_sweep
from bench.workloads.w0 import run_w0
from bench.workloads.w3 import run_w3
from bench.workloads.w12 import FLOW_LIMITS, FORMS, run_w12

WORKLOADS = ("W0", *FORMS, "W3", "sweep", "recovery", "ratelimit")
"""What runs without --only."""
ON_REQUEST = ("overload",)
"""What runs only when --only names it."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS + ON_REQUEST)}",
    )
    parser.add_argument("--repeat", type=int, default=None, help="override the repeat count")
    parser.add_argument(
        "--flow-limits",
        choices=FLOW_LIMITS,
        default="none",
        help="W1/W2 with flow limits defined: none, on another agent, or generous ones on "
        "the workload's agent (docs/flow-control.md)",
    )
    args = parser.parse_args()
    which = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = which - set(WORKLOADS + ON_REQUEST)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {WORKLOADS + ON_REQUEST}")
    sizes = Sizes.of(args.quick)
    if args.repeat is not None:
        sizes.repeat = max(1, args.repeat)
    sizes.flow_limits = args.flow_limits
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
    if which & set(FORMS):
        run_w12(sizes, results, which)
    if "W3" in which:
        run_w3(sizes, results)
    if "sweep" in which:
        run_sweep(sizes, results)
    if "recovery" in which:
        run_recovery(sizes, results)
    if "overload" in which:
        run_overload(args.quick, results)
    if "ratelimit" in which:
        run_ratelimit(sizes, results)
    say(f"done in {time.monotonic() - began:.0f}s; {load_line()}", results)


if __name__ == "__main__":
    main()
