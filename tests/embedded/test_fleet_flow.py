"""What the scheduler's fleet recorder tells flow control (on SQLite): a heartbeat that changes
an instance's capacity, actions or breakers asks for a new flow plan at once; the same again
does not; the plan then pauses an agent whose instances all said goodbye."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Engine

from sasflow.fleet_messages import AgentHeartbeat
from sasflow.scheduler.fleet import FleetRecorder
from sasflow.store.db import transaction
from sasflow.store.flow import limits
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.plan import make_plan
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names


class Heartbeats:
    """A transport with heartbeats waiting on the fleet queue."""

    def __init__(self) -> None:
        self.waiting: list[Delivery] = []

    def send(self, **fields: Any) -> None:
        beat = AgentHeartbeat(
            agent="pay",
            instance_id="pay-1",
            hostname="h",
            pid=1,
            version="t",
            concurrency=4,
            in_flight=0,
            interval_s=5,
            **fields,
        )
        self.waiting.append(Delivery(len(self.waiting) + 1, beat.encode(), "fleet", 1))

    def get(self, queue: str) -> Delivery | None:  # noqa: ARG002 - one queue here
        return self.waiting.pop(0) if self.waiting else None

    def ack(self, delivery: Delivery, multiple: bool = False) -> None:  # noqa: ARG002 - nothing to ack
        return None


def test_a_heartbeat_that_changes_the_fleet_asks_for_a_new_plan(sqlite_engine: Engine) -> None:
    transport, asked = Heartbeats(), []
    recorder = FleetRecorder(
        sqlite_engine, cast(Transport, transport), Names("t"), on_change=lambda: asked.append(1)
    )
    transport.send(seq=1, actions={"charge": "gateway"})
    recorder.poll()
    transport.send(seq=2, actions={"charge": "gateway"})
    recorder.poll()
    assert len(asked) == 1  # the same again changes nothing
    transport.send(seq=3, actions={"charge": "gateway"}, breakers={"gateway": "open"})
    recorder.poll()
    transport.send(seq=4, actions={"charge": "gateway"}, stopping=True)
    recorder.poll()
    assert len(asked) == 3
    with transaction(sqlite_engine) as conn:
        plan = make_plan(limits.enabled_limits(conn), read_fleet(conn))
    assert plan.paused == {"pay"}
    assert plan.bounds["pay"].reason == "no live agent instance"
