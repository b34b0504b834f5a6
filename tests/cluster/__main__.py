"""`python -m tests.cluster start|stop|status|env` (run by `scripts/cluster`): the local
cluster of three RabbitMQ nodes and a PostgreSQL primary with a synchronous standby.

  start   start it (a cluster already there: start what is down, nothing else)
  stop    stop every node and remove its directory (nothing there: nothing to do)
  status  each node, up or down; exits 0 when all are up, 1 when some are down, 3 when
          there is no cluster
  env     the variables that point sasflow (and the cluster tier) at it, as `export` lines:
          eval "$(scripts/cluster env)"

The state directory is SASFLOW_CLUSTER_DIR, by default one per checkout under the temporary
directory. Needs root, and the PostgreSQL and RabbitMQ binaries (`scripts/cluster` installs
Debian's packages when they are missing); the machine's own services are never touched.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from tests.chaos.instances import ServiceError
from tests.cluster.local import LocalCluster, default_directory

REPO = Path(__file__).resolve().parents[2]
TEST_CLUSTER = "SASFLOW_TEST_CLUSTER"
"""Names the state directory of a running cluster the cluster tier should use."""


def directory() -> Path:
    chosen = os.environ.get("SASFLOW_CLUSTER_DIR")
    return Path(chosen) if chosen else default_directory(REPO, Path(tempfile.gettempdir()))


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _print_status(cluster: LocalCluster) -> bool:
    rows = cluster.status()
    for part, name, up, detail in rows:
        print(f"  {part:<10} {name:<30} {'up' if up else 'DOWN':<5} {detail}")
    return all(up for _, _, up, _ in rows)


def start(root: Path) -> int:
    existing = LocalCluster.load(root)
    if existing is not None:
        began = time.monotonic()
        started = existing.attach()
        note = f"started {', '.join(started)}" if started else "nothing to start"
        print(f"cluster in {root}: already there, {note} ({time.monotonic() - began:.1f}s)")
        return 0 if _print_status(existing) else 1
    cluster = LocalCluster.new(root)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    print(f"cluster started in {root} ({cluster.timings.text()})")
    _print_status(cluster)
    print('use it: eval "$(scripts/cluster env)"')
    return 0


def stop(root: Path) -> int:
    cluster = LocalCluster.load(root)
    if cluster is None:
        print(f"no cluster in {root}: nothing to stop")
        return 0
    began = time.monotonic()
    cluster.stop()
    print(f"cluster in {root} stopped and removed ({time.monotonic() - began:.1f}s)")
    return 0


def status(root: Path) -> int:
    cluster = LocalCluster.load(root)
    if cluster is None:
        print(f"no cluster in {root}")
        return 3
    print(f"cluster in {root}:")
    return 0 if _print_status(cluster) else 1


def env(root: Path) -> int:
    cluster = LocalCluster.load(root)
    if cluster is None:
        print(f"no cluster in {root}: run scripts/cluster start", file=sys.stderr)
        return 3
    for name, value in {**cluster.environment(), TEST_CLUSTER: str(root)}.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


COMMANDS = {"start": start, "stop": stop, "status": status, "env": env}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=sorted(COMMANDS))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return COMMANDS[args.command](directory())
    except ServiceError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cluster: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
