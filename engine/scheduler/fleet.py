"""Record agent heartbeats in the state store (agents have no database access).

A scheduler calls `poll` from its loop about once a second: it takes what waits on
`<ns>.fleet` (each heartbeat reaches one of the schedulers), acks it at once and writes it in
one transaction. Taking with basic.get and acking before returning leaves no heartbeat unacked
between two calls, so the scheduler's multiple-acks of its replies (same channel) never cover
one. The price: heartbeats taken just before a database outage are lost, which only delays the
fleet view until the next heartbeat (every few seconds). A malformed heartbeat is dead-lettered
with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sasflow.errors import InvalidMessageError
from sasflow.fleet_messages import AgentHeartbeat
from sasflow.messages import parse
from sasflow.store.cluster import fleet
from sasflow.store.db import Engine, transaction
from sasflow.store.flow import limits
from sasflow.transport.base import Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)

POLL_BATCH = 500
"""Heartbeats taken (and written in one transaction) per poll."""
SEEN_MOST = 10_000
"""Instances whose last heartbeat a recorder remembers (to tell a change)."""


class FleetRecorder:
    """Takes the heartbeats waiting for the schedulers and writes them to `agent_instances`."""

    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        names: Names,
        *,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """`on_change` hears that a heartbeat changed what flow control reads of the fleet
        (an instance new, leaving, or with another capacity, actions or breaker states); the
        other schedulers hear it through the `limits` notification."""
        self._engine = engine
        self._transport = transport
        self._names = names
        self._on_change = on_change
        self._seen: dict[str, tuple[object, ...]] = {}
        self.recorded = 0
        self.dead_lettered = 0

    def poll(self) -> int:
        """Take up to POLL_BATCH heartbeats, ack them and record them; how many were taken
        (POLL_BATCH: more may wait). Raises StoreUnavailableError when the database is away."""
        taken: list[AgentHeartbeat] = []
        while len(taken) < POLL_BATCH:
            delivery = self._transport.get(self._names.fleet)
            if delivery is None:
                break
            try:
                heartbeat = parse(AgentHeartbeat, delivery.body)
            except InvalidMessageError as exc:
                self._transport.dead_letter(
                    delivery, str(exc), dead_letter_exchange=self._names.dead_letter_exchange
                )
                self.dead_lettered += 1
                continue
            self._transport.ack(delivery)
            taken.append(heartbeat)
        if taken:
            changed = self._changed(taken)
            with transaction(self._engine) as conn:
                fleet.record_heartbeats(conn, [report(h) for h in taken])
                if changed:
                    limits.notify_changed(conn, self._names.namespace)
            self.recorded += len(taken)
            if changed and self._on_change is not None:
                self._on_change()
        return len(taken)

    def _changed(self, taken: list[AgentHeartbeat]) -> bool:
        """Whether a heartbeat changes what the flow plan reads of its instance."""
        changed = False
        if len(self._seen) > SEEN_MOST:  # instances lost long ago: start again (one notify)
            self._seen.clear()
        for beat in taken:
            seen = (beat.stopping, beat.concurrency, beat.actions, sorted(beat.breakers.items()))
            if self._seen.get(beat.instance_id) != seen:
                self._seen[beat.instance_id] = seen
                changed = True
            if beat.stopping:
                self._seen.pop(beat.instance_id, None)
        return changed


def report(heartbeat: AgentHeartbeat) -> fleet.InstanceReport:
    """The store's command for one heartbeat (the same fields, less the message type)."""
    return fleet.InstanceReport(**heartbeat.model_dump(exclude={"type"}))
