"""`python -m tests.chaos --runs N --seed S --duration SECONDS [--cluster] [--no-early-acks]`:
the chaos suite's long form, on instances of its own or (`--cluster`) on the local cluster.

Exits 0 when every invariant held, 1 on any violation, 2 when the suite could not run (its
own PostgreSQL or RabbitMQ instance did not start). Ctrl-C and SIGTERM stop the processes
and service instances it started and remove their files.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from tests.chaos.instances import ServiceError
from tests.chaos.runner import ChaosConfig, run


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--runs", type=int, default=300, help="runs to submit (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="fault schedule seed (default 1)")
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of faults (default: max(100, runs / 4))",
    )
    parser.add_argument(
        "--heal-timeout",
        type=float,
        default=None,
        help="seconds allowed to settle after the faults (default: max(120, runs / 20))",
    )
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the processes' logs in this directory"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on the local cluster (3 RabbitMQ nodes, quorum queues, a PostgreSQL primary and "
        "its synchronous standby) with the cluster's faults",
    )
    parser.add_argument(
        "--cluster-dir",
        type=Path,
        default=None,
        help="with --cluster: use the running cluster of this state directory "
        "(scripts/cluster start; default: start one of the run's own)",
    )
    parser.add_argument(
        "--no-early-acks",
        action="store_true",
        help="do not tell the agents the broker's consumer timeout "
        "(SASFLOW_BROKER_CONSUMER_TIMEOUT=0): they acknowledge every request after its reply, "
        "and the long steps' check is expected to fail (it shows that it can)",
    )
    parser.add_argument(
        "--account-concurrency",
        type=int,
        default=1,
        help="the flow limit on `charge` per account (default 1; the invariant expects 1)",
    )
    parser.add_argument(
        "--no-account-limit",
        action="store_true",
        help="define no limit on `charge` (the invariant then shows what the limit prevents)",
    )
    args = parser.parse_args(argv)
    if args.cluster_dir is not None and not args.cluster:
        parser.error("--cluster-dir needs --cluster")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.account_concurrency < 1:
        parser.error("--account-concurrency must be at least 1 (0 would pause every charge)")
    config = ChaosConfig(
        runs=args.runs,
        seed=args.seed,
        duration=args.duration if args.duration is not None else max(100.0, args.runs / 4),
        heal_timeout=args.heal_timeout
        if args.heal_timeout is not None
        else max(120.0, args.runs / 20),
        logs=args.logs,
        cluster=args.cluster,
        cluster_dir=args.cluster_dir,
        early_acks=not args.no_early_acks,
        account_concurrency=None if args.no_account_limit else args.account_concurrency,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = run(config)
    except ServiceError as exc:
        print(f"chaos: cannot run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chaos: interrupted; everything it started was stopped", file=sys.stderr)
        return 130
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
