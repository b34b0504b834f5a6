"""An agent instance's link to its fleet, over RabbitMQ only (agents never touch the database).

- **Heartbeats** (docs/protocol.md, section 6): published to the `<ns>.fleet` topic exchange
  (routing key: the agent's name) when the instance connects, every `interval` seconds, and
  with `stopping: true` on a clean exit. A scheduler records them (sasflow.scheduler.fleet).
- **Shared breakers**: every instance binds a queue of its own to the agent's fanout exchange
  `<ns>.breakers.<agent>`; a breaker that opens or closes on its own is announced there, and
  the peers' announcements are applied to this instance's breakers. Best effort: an
  announcement lost (broker outage, instance reconnecting) only costs the per-process
  behaviour, each instance tripping on its own failures.

Everything here runs on the worker's owner thread, except `breaker_changed`, which worker
threads call (under a breaker's lock): it only queues the change and wakes the owner.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import time
from collections.abc import Mapping
from importlib import metadata

from sasflow.agents.resilience import SharedBreaker
from sasflow.errors import BrokerUnavailableError, InvalidMessageError, PublishError
from sasflow.fleet_messages import AgentHeartbeat, BreakerAnnouncement, BreakerStateName
from sasflow.messages import parse
from sasflow.states import LOST_AFTER_MISSED
from sasflow.transport.base import Delivery, Outgoing, Transport
from sasflow.transport.topology import Names, declare_breaker_queue

log = logging.getLogger(__name__)

BREAKER_PREFETCH = 100
MIN_HEARTBEAT_TTL = 10.0
"""Seconds a heartbeat may wait for a scheduler at least (else 3 of its intervals)."""
GOODBYE_TTL = 3600.0


def _version() -> str:
    try:
        return metadata.version("sasflow")
    except metadata.PackageNotFoundError:
        return "unknown"


class FleetLink:
    """Heartbeats and breaker announcements of one agent instance."""

    def __init__(
        self,
        instance_id: str,
        agent: str,
        transport: Transport,
        names: Names,
        *,
        concurrency: int,
        interval: float,
        actions: Mapping[str, str | None] | None = None,
    ) -> None:
        """`actions`: each action the instance handles -> the dependency it uses (heartbeats
        carry it, so the claim can hold a dependency's steps fleet-wide)."""
        if interval <= 0:
            raise ValueError("the heartbeat interval must be > 0")
        self.instance_id = instance_id
        self._agent = agent
        self._transport = transport
        self._names = names
        self._concurrency = concurrency
        self._interval = interval
        self._actions = None if actions is None else dict(actions)
        self._version = _version()
        self._hostname = socket.gethostname()[:255]
        self._changes: queue.SimpleQueue[BreakerAnnouncement] = queue.SimpleQueue()
        self._breakers: Mapping[str, SharedBreaker] = {}
        self.next_heartbeat = time.monotonic()
        self.heartbeats = 0
        self._connections = 0
        self.announced = 0
        self.applied = 0

    # -- owner thread ---------------------------------------------------------------------

    def connected(self, breakers: Mapping[str, SharedBreaker]) -> None:
        """After each (re)connection: listen to the peers' breakers, say we are here."""
        self._breakers = breakers
        if breakers:
            # A queue of its own per connection: its name is unique to this process incarnation
            # (the instance id's last part) and connection. On a cluster a classic queue whose
            # node is down cannot be declared again ("home node ... is down"); the queue of an
            # earlier connection is deleted by the broker once unused (x-expires).
            self._connections += 1
            suffix = f"{self.instance_id.rpartition(':')[2]}-{self._connections}"
            queue_name = declare_breaker_queue(self._transport, self._names, self._agent, suffix)
            self._transport.consume(queue_name, self._on_announcement, prefetch=BREAKER_PREFETCH)
        self.heartbeat(breakers, in_flight=0)

    def tick(self, breakers: Mapping[str, SharedBreaker], *, in_flight: int, held: int = 0) -> None:
        """Publish the breaker changes queued by worker threads, and a heartbeat when due."""
        while True:
            try:
                change = self._changes.get_nowait()
            except queue.Empty:
                break
            self._publish(
                Outgoing(
                    exchange=self._names.breakers(self._agent),
                    routing_key="",
                    body=change.encode(),
                    # Stale once the announced open period is over.
                    expiration_ms=max(1000, int(change.open_for_s * 1000)),
                ),
                what=f"breaker {change.dependency} {change.state}",
            )
            self.announced += 1
            self.next_heartbeat = 0.0  # tell the cluster (the claim holds open breakers) now
        if time.monotonic() >= self.next_heartbeat:
            self.heartbeat(breakers, in_flight=in_flight, held=held)

    def heartbeat(
        self,
        breakers: Mapping[str, SharedBreaker],
        *,
        in_flight: int,
        held: int = 0,
        stopping: bool = False,
    ) -> None:
        message = AgentHeartbeat(
            agent=self._agent,
            instance_id=self.instance_id,
            hostname=self._hostname,
            pid=os.getpid(),
            version=self._version[:50],
            concurrency=self._concurrency,
            in_flight=in_flight,
            held=held,
            breakers={d: _state_name(b.state) for d, b in breakers.items()},
            interval_s=self._interval,
            seq=self.heartbeats + 1,
            stopping=stopping,
            actions=self._actions,
            breakers_open_for_s=_open_for(breakers),
        )
        self.next_heartbeat = time.monotonic() + self._interval
        self._publish(
            Outgoing(
                exchange=self._names.fleet,
                routing_key=self._agent,
                body=message.encode(),
                # A heartbeat nobody took for a while is stale (it would show a dead instance
                # live again); the goodbye stays valid far longer.
                expiration_ms=int(
                    GOODBYE_TTL * 1000
                    if stopping
                    else max(self._interval * LOST_AFTER_MISSED, MIN_HEARTBEAT_TTL) * 1000
                ),
            ),
            what="heartbeat",
        )
        self.heartbeats += 1

    def _publish(self, message: Outgoing, *, what: str) -> None:
        try:
            self._transport.publish(message)
        except BrokerUnavailableError:
            raise
        except PublishError as exc:  # refused (e.g. permissions): the fleet view only suffers
            log.warning("%s: %s not published: %s", self.instance_id, what, exc)

    def _on_announcement(self, delivery: Delivery) -> None:
        try:
            change = parse(BreakerAnnouncement, delivery.body)
        except InvalidMessageError as exc:
            self._transport.dead_letter(
                delivery, str(exc), dead_letter_exchange=self._names.dead_letter_exchange
            )
            return
        self._transport.ack(delivery)
        if change.instance_id == self.instance_id or change.agent != self._agent:
            return  # our own, echoed by the fanout
        breaker = self._breakers.get(change.dependency)
        if breaker is None:
            log.info("%s: announcement for unknown breaker %r", self.instance_id, change)
            return
        if breaker.apply_remote(change.state, change.open_for_s):
            self.applied += 1
            self.next_heartbeat = 0.0  # the fleet view learns it with the next tick
            log.info(
                "%s: breaker %s %s, as instance %s announced",
                self.instance_id,
                change.dependency,
                change.state,
                change.instance_id,
            )

    # -- worker threads -------------------------------------------------------------------

    def breaker_changed(self, dependency: str, state: str, open_for: float) -> None:
        """A breaker opened or closed on its own (called under its lock): queue the news."""
        self._changes.put(
            BreakerAnnouncement(
                agent=self._agent,
                instance_id=self.instance_id,
                dependency=dependency,
                state="open" if state == "open" else "closed",
                open_for_s=open_for,
            )
        )
        with contextlib.suppress(BrokerUnavailableError):
            self._transport.call_threadsafe(lambda: None)


_STATES: dict[str, BreakerStateName] = {
    "closed": "closed",
    "open": "open",
    "half-open": "half-open",
}


def _state_name(state: str) -> BreakerStateName:
    return _STATES.get(state, "closed")


def _open_for(breakers: Mapping[str, SharedBreaker]) -> dict[str, float]:
    found = {}
    for dependency, breaker in breakers.items():
        seconds = breaker.open_for()
        if seconds is not None:
            found[dependency] = round(seconds, 3)
    return found
