"""Three RabbitMQ nodes clustered on this machine, each a `RabbitInstance` of its own (node
name, AMQP and distribution ports, files) sharing one Erlang cookie."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.chaos.broker import connect
from tests.chaos.instances import RabbitInstance, ServiceError

NODE_CONFIG = "queue_leader_locator = balanced\n"
"""New quorum queues' leaders spread over the nodes (docs/howto/production-topology.md)."""


def in_parallel(actions: Sequence[Callable[[], None]]) -> None:
    """Run each action in a thread of its own; raise the first failure once all ended."""
    errors: list[BaseException] = []

    def guarded(action: Callable[[], None]) -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(a,), daemon=True) for a in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class RabbitCluster:
    """`nodes[0]` is the seed the others join; any node serves every queue."""

    def __init__(
        self,
        root: Path,
        prefix: str,
        cookie: str,
        ports: Sequence[tuple[int, int]],
        *,
        consumer_timeout: float | None = None,
    ) -> None:
        """`consumer_timeout`: the nodes', in seconds (default: RabbitMQ's, 30 minutes)."""
        self.nodes = [
            RabbitInstance(
                root / f"c{n}",
                f"c{n}",
                prefix=prefix,
                ports=pair,
                cookie=cookie,
                config=NODE_CONFIG,
                consumer_timeout=consumer_timeout,
            )
            for n, pair in enumerate(ports, start=1)
        ]

    @property
    def url(self) -> str:
        """The broker list every role gets (SASFLOW_BROKER_URL)."""
        return ",".join(node.url for node in self.nodes)

    def start(self) -> None:
        """Boot every node at once, then join the others to the first, one at a time (two
        nodes joining the same seed together may both reset its membership table)."""
        in_parallel([node.start for node in self.nodes])
        for node in self.nodes[1:]:
            node.join(self.nodes[0])

    def attach(self) -> None:
        """Take over nodes started by another process (`scripts/cluster start`)."""
        for node in self.nodes:
            node.started = True

    def answering(self) -> dict[str, bool]:
        """Node name -> whether RabbitMQ runs in it (asked of all at once)."""
        found: dict[str, bool] = {}

        def ask(node: RabbitInstance) -> None:
            found[node.node] = node.answers()

        in_parallel([functools.partial(ask, node) for node in self.nodes])
        return found

    def heal(self) -> list[str]:
        """Boot the nodes that do not answer (they rejoin the cluster on their files); the
        names of those booted."""
        answering = self.answering()
        down = [node for node in self.nodes if not answering[node.node]]
        in_parallel([node.boot for node in down])
        return [node.node for node in down]

    def stop(self) -> None:
        in_parallel([node.stop for node in self.nodes])

    def node(self, name: str) -> RabbitInstance:
        for node in self.nodes:
            if node.node == name:
                return node
        raise ServiceError(f"{name} is no node of this cluster")

    def listing(self, kind: str, *fields: str) -> list[dict[str, object]]:
        """`rabbitmqctl <kind>`, asked of the first node that answers."""
        failures = []
        for node in self.nodes:
            try:
                return node.listing(kind, *fields)
            except ServiceError as exc:
                failures.append(str(exc))
        raise ServiceError(f"no node answered {kind}: {failures}")

    def queues(self) -> list[dict[str, object]]:
        """Every queue with its type, leader, members and the members online."""
        return self.listing("list_queues", "name", "type", "leader", "members", "online")

    def leader(self, queue: str) -> RabbitInstance:
        """The node that leads quorum queue `queue` now."""
        for row in self.queues():
            if row.get("name") == queue:
                leader = row.get("leader")
                if isinstance(leader, str) and leader:
                    return self.node(leader)
                raise ServiceError(f"queue {queue} has no leader: {row}")
        raise ServiceError(f"no queue {queue} in the cluster")

    def delete_namespace(self, namespace: str) -> None:
        """Delete the queues and exchanges of `namespace` (a test's own)."""
        prefix = f"{namespace}."
        queues = [
            str(row["name"])
            for row in self.listing("list_queues", "name")
            if str(row["name"]).startswith(prefix)
        ]
        exchanges = [
            str(row["name"])
            for row in self.listing("list_exchanges", "name")
            if str(row["name"]).startswith(prefix)
        ]
        with contextlib.closing(connect(self.url)) as connection:
            channel = connection.channel()
            for queue in queues:
                channel.queue_delete(queue)
            for exchange in exchanges:
                channel.exchange_delete(exchange)

    def home(self, queue: str) -> RabbitInstance:
        """The node that holds classic queue `queue` (the one that lists it as local)."""
        for node in self.nodes:
            if any(
                row.get("name") == queue for row in node.listing("list_queues", "--local", "name")
            ):
                return node
        raise ServiceError(f"no node holds queue {queue}")

    def close_connections(self, name: str) -> int:
        """Close (as `rabbitmqctl close_connection` does) every client connection whose
        `connection_name` holds `name`; how many were closed."""
        answering = self.answering()
        node = next(n for n in self.nodes if answering[n.node])
        listed = node.ctl(
            "list_connections", "-q", "--no-table-headers", "pid", "client_properties"
        )
        pids = [
            line.split("\t", 1)[0]
            for line in listed.stdout.splitlines()
            if f'{{"connection_name","{name}' in line
        ]
        for pid in pids:
            node.ctl("close_connection", pid, "closed by the test")
        return len(pids)

    def other_than(self, *nodes: RabbitInstance) -> RabbitInstance:
        """A node that is none of `nodes`."""
        for node in self.nodes:
            if node not in nodes:
                return node
        raise ServiceError("every node is excluded")
