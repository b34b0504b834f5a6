"""Submit-to-completion latency of one-step runs, one at a time (W3 of bench/run.py alone).

    python bench/latency.py [--runs 200] [--rate 20]

Starts a scheduler and an agent (threads of this process, real PostgreSQL and RabbitMQ, a
scratch database and namespace), submits one run at a time in its own transaction at `--rate`
runs/s, and times each from just before the submitting commit to the arrival of its
`run.completed` status notification. Prints p50, p95 and p99 in milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.run import Sizes, latency_once, percentile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    sizes = dataclasses.replace(
        Sizes.of(quick=True), w3_seconds=args.runs / args.rate, w3_rate=args.rate
    )
    latencies = latency_once(sizes)
    print(
        f"{len(latencies)}/{args.runs} one-step runs at {args.rate:g}/s: "
        f"p50 {statistics.median(latencies):.1f} ms, p95 {percentile(latencies, 0.95):.1f} "
        f"ms, p99 {percentile(latencies, 0.99):.1f} ms (submit commit -> completion "
        "notification)"
    )


if __name__ == "__main__":
    main()
