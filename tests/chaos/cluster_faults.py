"""The chaos run on the local cluster (`python -m tests.chaos --cluster`): three RabbitMQ nodes
with quorum work queues and a PostgreSQL primary with its synchronous standby, and their faults.

- `leader_kill_agent`: SIGKILL of the node leading `<ns>.agent.<alpha or beta>`, booted again
  after the fault's hold (1-8 s), in the background: the fault's recovery (a probe run's first
  step) is measured while the node is down;
- `leader_kill_submit`, `leader_kill_replies`: the same for `<ns>.submit`, `<ns>.replies`;
- `node_kill_other`: the same for a node leading no agent queue (or at least not alpha's);
- `queue_delete`: `<ns>.agent.<alpha or beta>` or `<ns>.replies` deleted under its consumers;
- `pg_failover`: the standby promoted; the old primary, still running (its commits wait for a
  standby), is stopped up to 4 s later and rebuilt as the new primary's synchronous standby,
  in the background as well.

A fault waits for the previous one's restoration (before its clock starts): one node down at a
time. A fault's clock starts when it hits (the SIGKILL, the delete, the promotion), not while
its target is looked for (a `rabbitmqctl list_queues`, about a second).

The processes get the three nodes as their broker list and both servers in a multi-host
database URL, as in production (docs/howto/production-topology.md). The nodes get the run's
consumer timeout (10 s, for the `long_steps` fault): in their files when the cluster is the
run's own, else in their memory for the run's duration.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sasflow.transport.topology import Names
from tests.chaos.app import alpha, beta
from tests.chaos.broker import connect
from tests.chaos.faults import Fault
from tests.chaos.fleet import Fleet
from tests.chaos.instances import APP_ROLE, RabbitInstance, ServiceError
from tests.chaos.stacks import Actions
from tests.cluster.local import LocalCluster
from tests.cluster.postgres import PostgresPair
from tests.cluster.rabbit import RabbitCluster

RESTORE_TIMEOUT = 300.0
"""Seconds a node's boot or a standby's rebuild may take."""
FAILOVER_HOLD_MAX = 4.0
"""Seconds at most the old primary runs after the promotion (its commits wait meanwhile)."""


class Cluster:
    """The local cluster as a chaos run's stack: its own (started and removed with the run),
    or a running one (`running`: its state directory), used and left running."""

    def __init__(
        self,
        root: Path,
        running: Path | None,
        names: Names,
        *,
        consumer_timeout: float | None = None,
    ) -> None:
        """`consumer_timeout`: the RabbitMQ nodes', in seconds: in the files of a cluster of
        the run's own; in the memory of a running one's nodes until the run ends (given again
        to a node it restarts), since their files have theirs."""
        self.names = names
        self.own = running is None
        self.consumer_timeout = consumer_timeout
        self._saved: dict[str, dict[str, int | None]] = {}
        """A running cluster's nodes' settings before the run (restored at its end)."""
        if running is None:
            self.local = LocalCluster.new(root / "cluster", consumer_timeout=consumer_timeout)
        else:
            found = LocalCluster.load(running)
            if found is None:
                raise ServiceError(f"no cluster in {running}: run scripts/cluster start")
            self.local = found
        self.database = names.namespace  # a database of the run's own, even on a shared cluster
        self._restoring: threading.Thread | None = None
        self._restore_failed: list[str] = []
        self._began: float | None = None

    @property
    def rabbit(self) -> RabbitCluster:
        return self.local.rabbit

    @property
    def postgres(self) -> PostgresPair:
        return self.local.postgres

    @property
    def broker_url(self) -> str:
        return self.local.broker_url

    @property
    def database_url(self) -> str:
        return self.local.database_url(APP_ROLE, self.database)

    @property
    def admin_url(self) -> str:
        return self.local.database_url("postgres", self.database)

    def environment(self) -> dict[str, str]:
        return {"SASFLOW_BROKER_QUEUE_TYPE": "quorum"}

    def start(self) -> None:
        if self.own:
            self.local.start()
        else:
            self.local.attach()
            self._override(self.rabbit.nodes)
        self.postgres.primary.admin(f'CREATE DATABASE "{self.database}" OWNER {APP_ROLE}')

    def _override(self, nodes: list[RabbitInstance]) -> None:
        """A running cluster's `nodes` get the run's consumer timeout (in memory)."""
        if self.own or self.consumer_timeout is None:
            return
        for node in nodes:
            saved = node.override_consumer_timeout(self.consumer_timeout)
            self._saved.setdefault(node.node, saved)  # a restarted node read its files again

    def _boot(self, node: RabbitInstance) -> None:
        node.boot()
        self._override([node])

    def describe(self) -> str:
        nodes = ", ".join(f"{n.node} :{n.port}" for n in self.rabbit.nodes)
        pair = self.postgres
        timeout = self.consumer_timeout
        return (
            f"rabbitmq {nodes}"
            + ("" if timeout is None else f" (consumer timeout {timeout:g}s)")
            + f"; postgresql {pair.primary_name} :{pair.primary.port} primary, "
            f"{pair.standby_name} :{pair.standby.port} synchronous standby"
            + ("" if self.own else f"; cluster of {self.local.root}")
        )

    def targets(self) -> dict[str, list[str]]:
        agents = [alpha.name, beta.name]
        return {
            "leader_kill_agent": agents,
            "queue_delete": [*(f"agent.{a}" for a in agents), "replies"],
        }

    def _queue(self, target: str) -> str:
        kind, _, agent = target.partition(".")
        return self.names.agent(agent) if kind == "agent" else getattr(self.names, kind)

    def _restore_later(self, restore: Callable[[], None], after: float) -> None:
        """Run `restore` `after` seconds from now, in the background: the fault's action ends
        (and the probe run measures the recovery) while the node is still down."""

        def later() -> None:
            time.sleep(after)
            try:
                restore()
            except Exception as exc:  # noqa: BLE001 - raised by the next `_restored`
                self._restore_failed.append(f"{type(exc).__name__}: {exc}")

        self._restoring = threading.Thread(target=later, name="chaos-restore", daemon=True)
        self._restoring.start()

    def _restored(self) -> None:
        """Wait for the last fault's restoration (one node down at a time: a quorum queue
        needs two of its three); ServiceError if it failed."""
        if self._restoring is not None:
            self._restoring.join(RESTORE_TIMEOUT)
            if self._restoring.is_alive():
                raise ServiceError("the last fault's restoration did not end")
            self._restoring = None
        if self._restore_failed:
            failed, self._restore_failed = self._restore_failed, []
            raise ServiceError(f"the last fault's restoration failed: {failed}")

    def ready(self) -> None:
        self._began = None
        self._restored()

    def began(self) -> float | None:
        return self._began

    def _kill_for(self, node: RabbitInstance, hold: float) -> None:
        pid = node.pid()
        self._began = time.time()
        node.kill(pid)
        self._restore_later(lambda: self._boot(node), hold)

    def actions(self, fleet: Fleet) -> Actions:  # noqa: ARG002 - no fault here needs the fleet
        names, rabbit = self.names, self.rabbit

        def kill_leader(queue: str, fault: Fault) -> str:
            leader = rabbit.leader(queue)
            self._kill_for(leader, fault.hold)
            return f"{leader.node} (leading {queue}) SIGKILLed, booted {fault.hold}s later"

        def node_kill_other(fault: Fault) -> str:
            leaders = {rabbit.leader(names.agent(a)) for a in (alpha.name, beta.name)}
            spared = [n for n in rabbit.nodes if n not in leaders]
            node = spared[0] if spared else rabbit.other_than(rabbit.leader(names.agent("alpha")))
            self._kill_for(node, fault.hold)
            return f"{node.node} (leading no agent queue) SIGKILLed, booted {fault.hold}s later"

        def queue_delete(fault: Fault) -> str:
            queue = self._queue(fault.target)
            with contextlib.closing(connect(self.broker_url)) as connection:
                channel = connection.channel()
                self._began = time.time()
                deleted = channel.queue_delete(queue)
            return f"{queue} deleted with {deleted.method.message_count} messages in it"

        def pg_failover(fault: Fault) -> str:
            pair = self.postgres
            hold = min(fault.hold, FAILOVER_HOLD_MAX)
            self._began = time.time()
            old = pair.promote()
            self._restore_later(lambda: pair.fence(old), hold)
            return (
                f"{pair.primary_name} promoted; {old} stopped {hold}s later and rebuilt as its "
                "synchronous standby"
            )

        return {
            "leader_kill_agent": lambda f: kill_leader(names.agent(f.target), f),
            "leader_kill_submit": lambda f: kill_leader(names.submit, f),
            "leader_kill_replies": lambda f: kill_leader(names.replies, f),
            "node_kill_other": node_kill_other,
            "queue_delete": queue_delete,
            "pg_failover": pg_failover,
        }

    def ensure_running(self) -> None:
        try:
            self._restored()
        finally:
            booted = self.local.heal()
            self._override([node for node in self.rabbit.nodes if node.node in booted])

    def brokers(self) -> list[RabbitInstance]:
        return list(self.rabbit.nodes)

    def stop(self) -> None:
        if self.own:
            self.local.stop()
            return
        with contextlib.suppress(ServiceError):
            self.local.heal()
            for node in self.rabbit.nodes:
                if node.node in self._saved:
                    node.set_settings(self._saved[node.node])
            self.rabbit.delete_namespace(self.names.namespace)
            self.postgres.primary.admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
