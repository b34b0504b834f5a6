"""The services a chaos run stands on, and the faults they can suffer.

`SingleNode` is one PostgreSQL and one RabbitMQ instance of the run's own (the suite's first
form). `Cluster` (tests/chaos/cluster_faults.py) is the local cluster: three RabbitMQ nodes with
quorum work queues and a PostgreSQL primary with a synchronous standby. A stack starts and
stops its services, names the URLs the processes and the checks use, and carries out its own
fault kinds; the runner does the rest (the fleet, the load, the process and message faults).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from tests.chaos.faults import Fault
from tests.chaos.fleet import Fleet
from tests.chaos.instances import PostgresInstance, RabbitInstance

Actions = dict[str, Callable[[Fault], str]]

FREEZE_BASE = 12.0
"""Seconds a `rabbit_freeze` lasts at least: past pika's socket and handshake timeouts, so a
role reconnecting meanwhile meets a stalled AMQP handshake."""


class Stack(Protocol):
    @property
    def broker_url(self) -> str: ...

    @property
    def database_url(self) -> str:
        """The sasflow processes' (the database owner's, not a superuser)."""

    @property
    def admin_url(self) -> str:
        """The superuser's: the harness's checks and probes."""

    def environment(self) -> dict[str, str]:
        """Variables the sasflow processes get besides the URLs."""

    def start(self) -> None: ...

    def describe(self) -> str: ...

    def targets(self) -> dict[str, list[str]]:
        """Fault kind -> what it may hit (a kind not listed hits its services)."""

    def actions(self, fleet: Fleet) -> Actions: ...

    def ready(self) -> None:
        """Before a fault: wait until the services are back from the last one."""

    def began(self) -> float | None:
        """When the last fault of the services hit them (wall clock), if later than its
        action started (after finding its target); None otherwise."""

    def ensure_running(self) -> None:
        """Start whatever a fault left down (healing)."""

    def brokers(self) -> list[RabbitInstance]:
        """The RabbitMQ nodes (their logs count the channels closed by the consumer timeout)."""

    def stop(self) -> None: ...


class SingleNode:
    """One PostgreSQL and one RabbitMQ instance of the run's own, on free ports."""

    def __init__(self, root: Path, run_id: str, *, consumer_timeout: float | None = None) -> None:
        """`consumer_timeout`: the RabbitMQ node's, in seconds (default: RabbitMQ's)."""
        self.postgres = PostgresInstance(root)
        self.rabbit = RabbitInstance(root, run_id, consumer_timeout=consumer_timeout)

    @property
    def broker_url(self) -> str:
        return self.rabbit.url

    @property
    def database_url(self) -> str:
        return self.postgres.app_url

    @property
    def admin_url(self) -> str:
        return self.postgres.url

    def environment(self) -> dict[str, str]:
        return {}

    def start(self) -> None:
        self.postgres.start()
        self.rabbit.start()

    def describe(self) -> str:
        timeout = self.rabbit.consumer_timeout
        return (
            f"postgres :{self.postgres.port}, rabbitmq {self.rabbit.node} :{self.rabbit.port}"
            + ("" if timeout is None else f" (consumer timeout {timeout:g}s)")
        )

    def targets(self) -> dict[str, list[str]]:
        return {}

    def actions(self, fleet: Fleet) -> Actions:
        rabbit, postgres = self.rabbit, self.postgres

        def rabbit_stop_app(fault: Fault) -> str:
            rabbit.stop_app_start_app(fault.hold)
            return f"stop_app, start_app after {fault.hold}s"

        def rabbit_kill(fault: Fault) -> str:
            rabbit.hard_kill_and_restart(fault.hold)
            return f"beam SIGKILL, restarted after {fault.hold}s"

        def rabbit_freeze(fault: Fault) -> str:
            # A scheduler restarting now must connect to a node that does not answer.
            victim = f"scheduler-{1 + int(fault.hold) % 2}"
            fleet.kill(victim)
            rabbit.freeze_for(FREEZE_BASE + fault.hold)
            return f"beam SIGSTOP for {FREEZE_BASE + fault.hold:.1f}s, {victim} killed first"

        def rabbit_disk_alarm(fault: Fault) -> str:
            rabbit.disk_alarm_for(fault.hold)
            return f"disk alarm for {fault.hold}s"

        def pg_restart(fault: Fault) -> str:
            postgres.restart_immediate()
            return "pg_ctl restart -m immediate"

        def pg_read_only(fault: Fault) -> str:
            postgres.read_only_for(fault.hold * 2)
            return f"read-only for {fault.hold * 2:.1f}s"

        def pg_connection_limit(fault: Fault) -> str:
            postgres.connection_limit_for(fault.hold)
            return f"role connection limit 0, its sessions cut, for {fault.hold}s"

        return {
            "rabbit_stop_app": rabbit_stop_app,
            "rabbit_kill": rabbit_kill,
            "rabbit_freeze": rabbit_freeze,
            "rabbit_disk_alarm": rabbit_disk_alarm,
            "pg_restart": pg_restart,
            "pg_read_only": pg_read_only,
            "pg_connection_limit": pg_connection_limit,
        }

    def ready(self) -> None:
        return

    def began(self) -> float | None:
        return None

    def ensure_running(self) -> None:
        self.rabbit.ensure_running()
        self.postgres.ensure_running()

    def brokers(self) -> list[RabbitInstance]:
        return [self.rabbit]

    def stop(self) -> None:
        self.rabbit.stop()
        self.postgres.stop()
