"""The local cluster: three RabbitMQ nodes and a PostgreSQL pair under one state directory.

The directory holds everything: `state.json` (node names, ports, the shared Erlang cookie),
each RabbitMQ node's files (`c1/`, `c2/`, `c3/`) and each PostgreSQL server's (`pg_a/`,
`pg_b/`). A cluster started by one process (`scripts/cluster start`) is taken over by another
(`stop`, `status`, a test session) from that file. Nothing outside the directory is written,
no port is fixed (free loopback ports are picked when the cluster is made), and the machine's
own PostgreSQL and RabbitMQ are never touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.chaos.instances import ServiceError, free_port
from tests.cluster.postgres import NAMES, PostgresPair
from tests.cluster.rabbit import RabbitCluster, in_parallel

STATE = "state.json"
RABBIT_NODES = 3
APP_USER = "sasflow_app"
"""The database owner the instances create (tests.chaos.instances.APP_ROLE)."""


def default_directory(repo: Path, temp: Path) -> Path:
    """One state directory per checkout, under the temporary directory: the `postgres` user
    must reach it (a checkout under a private home directory would not do)."""
    digest = hashlib.sha1(str(repo.resolve()).encode()).hexdigest()[:8]  # noqa: S324 - a name
    return temp / f"sasflow-cluster-{digest}"


@dataclass
class Timings:
    """Seconds each part of a start took."""

    parts: dict[str, float] = field(default_factory=dict)

    def text(self) -> str:
        return ", ".join(f"{name} {seconds:.1f}s" for name, seconds in self.parts.items())


class LocalCluster:
    def __init__(self, root: Path, state: dict[str, Any]) -> None:
        self.root = root
        self.state = state
        self.id = str(state["id"])
        self.rabbit = RabbitCluster(
            root,
            f"sasflow-{self.id}",
            str(state["cookie"]),
            [(int(n["port"]), int(n["dist_port"])) for n in state["rabbit"]],
            consumer_timeout=state.get("consumer_timeout"),
        )
        ports = [int(state["postgres"][name]) for name in NAMES]
        self.postgres = PostgresPair(root, (ports[0], ports[1]))
        self.timings = Timings()

    @classmethod
    def new(cls, root: Path, *, consumer_timeout: float | None = None) -> LocalCluster:
        """A cluster description on fresh ports, written to `root` (which must not hold one);
        `consumer_timeout`: its RabbitMQ nodes', in seconds (default: RabbitMQ's)."""
        if (root / STATE).exists():
            raise ServiceError(f"{root} already holds a cluster")
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)  # the postgres user must reach its data directories
        state = {
            "id": hashlib.sha1(str(root).encode()).hexdigest()[:6],  # noqa: S324 - a name
            "cookie": os.urandom(20).hex().upper(),
            "rabbit": [
                {"port": free_port(), "dist_port": free_port()} for _ in range(RABBIT_NODES)
            ],
            "postgres": {name: free_port() for name in NAMES},
            "consumer_timeout": consumer_timeout,
        }
        (root / STATE).write_text(json.dumps(state, indent=2) + "\n")
        return cls(root, state)

    @classmethod
    def load(cls, root: Path) -> LocalCluster | None:
        """The cluster described in `root`, or None when there is none."""
        try:
            state = json.loads((root / STATE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ServiceError(f"{root / STATE} is unreadable: {exc}") from exc
        return cls(root, state)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start a new cluster's nodes (`timings` says how long each part took)."""
        timings = self.timings
        begun = time.monotonic()

        def rabbit() -> None:
            self.rabbit.start()
            timings.parts["rabbitmq (3 nodes, clustered)"] = time.monotonic() - begun

        def postgres() -> None:
            self.postgres.start()
            timings.parts["postgresql (primary, synchronous standby)"] = time.monotonic() - begun

        in_parallel([rabbit, postgres])
        timings.parts["total"] = time.monotonic() - begun

    def attach(self) -> list[str]:
        """Take over a cluster another process started, starting the nodes that are down
        (they rejoin on their files); the names of those started."""
        self.rabbit.attach()
        self.postgres.attach()
        return self.heal()

    def heal(self) -> list[str]:
        """Start what is down (after a test killed or stopped it)."""
        return self.rabbit.heal() + self.postgres.heal()

    def stop(self) -> None:
        """Stop every node and remove the state directory."""
        self.rabbit.attach()
        self.postgres.attach()
        try:
            in_parallel([self.rabbit.stop, self.postgres.stop])
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- what the processes and tests use ------------------------------------------------

    @property
    def broker_url(self) -> str:
        return self.rabbit.url

    def database_url(self, user: str = APP_USER, database: str = "sasflow") -> str:
        return self.postgres.url(user, database)

    def environment(self) -> dict[str, str]:
        """What a process needs to run sasflow on the cluster."""
        return {
            "SASFLOW_BROKER_URL": self.broker_url,
            "SASFLOW_BROKER_QUEUE_TYPE": "quorum",
            "SASFLOW_DATABASE_URL": self.database_url(),
        }

    def status(self) -> list[tuple[str, str, bool, str]]:
        """(part, name, up, detail) of every node."""
        rows: list[tuple[str, str, bool, str]] = []
        members: set[str] = set()
        with contextlib.suppress(ServiceError):
            for node in self.rabbit.nodes:
                if node.answers():
                    members = _running_members(node.ctl("cluster_status", "--formatter", "json"))
                    break
        for node in self.rabbit.nodes:
            up = node.answers()
            detail = f"amqp :{node.port}, dist :{node.dist_port}"
            if up:
                detail += ", in the cluster" if node.node in members else ", NOT in the cluster"
            rows.append(("rabbitmq", node.node, up, detail))
        for name, server in self.postgres.servers.items():
            up = server.running()
            role = ""
            if up:
                try:
                    role = ", standby" if server.in_recovery() else ", primary"
                except psycopg.Error as exc:
                    role = f", not answering ({exc})"
            rows.append(("postgresql", name, up, f":{server.port}{role}"))
        return rows


def _running_members(done: Any) -> set[str]:
    try:
        status = json.loads(done.stdout)
    except ValueError:
        return set()
    nodes = status.get("running_nodes", []) if isinstance(status, dict) else []
    return {str(node) for node in nodes}
