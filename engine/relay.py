"""Publish recorded events as status notifications (the events table is the outbox).

Any process with the database and the broker may relay; rows are locked with SKIP LOCKED so
relays never publish the same event concurrently. Delivery is at least once: an event is
marked published only after the broker confirmed it, so consumers dedupe on `event_id`.
The same transaction queues each event for the subscription stream's matching subscribers
(`store.stream.fan_out`), so the stream's updates follow the events' order too.

A pass leaves (holds back) the events of a run whose earlier event another relay holds; they
stay locked by the pass's transaction until it ends, so no other relay sees them meanwhile.
The relay that held them back therefore passes again soon after that transaction ended
(`HeldBack`), until a pass holds nothing back: they go out milliseconds after their
predecessor, not at the next periodic pass.

The event of a step cancelled in flight (sasflow.ops.cancel) also goes out as a `Cancel` on the
control exchange, to the instances of the agent holding the attempt, in the same batch: the
cancel reaches the agent at least once, as soon as the broker takes it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from pydantic import ValidationError

from sasflow.errors import BrokerUnavailableError
from sasflow.hooks import NO_HOOKS, Hooks
from sasflow.messages import Cancel, StatusEvent, safe_text
from sasflow.states import StepState
from sasflow.store.db import (
    Connection,
    Engine,
    pool_capacity,
    spare_connections,
    transaction,
    translated,
)
from sasflow.store.dialect import capabilities
from sasflow.store.outbox import stream
from sasflow.store.runs import events
from sasflow.transport.base import AsyncPublisher, Outgoing, PublishTicket, Transport
from sasflow.transport.topology import Names

log = logging.getLogger(__name__)


def routing_key(workflow: str, entity: str, state: str) -> str:
    """`<workflow>.<run|step>.<state>`, e.g. `order.run.completed`."""
    return f"{workflow}.{entity}.{state}"


HELD_BACK_RETRY = 0.002
"""Seconds after a pass that held events back before the first pass again; it doubles while
passes keep holding back (the earlier event's relay awaits its confirms, usually 1-5 ms)."""


class HeldBack:
    """When to pass again after a pass that held events back: `delay` after it, starting at
    HELD_BACK_RETRY and doubling up to `longest` while passes keep holding back."""

    def __init__(self, longest: float) -> None:
        self._longest = max(longest, HELD_BACK_RETRY)
        self.delay = HELD_BACK_RETRY

    def passed(self, *, held_back: bool) -> None:
        """A pass ended: the next delay doubles if it held back, else starts over."""
        self.delay = min(self.delay * 2, self._longest) if held_back else HELD_BACK_RETRY


class Pass(NamedTuple):
    """One relay pass: how many events it relayed, and whether it held events back (then
    relay again soon: see the module docstring)."""

    relayed: int
    held_back: bool


def relay_events(
    engine: Engine, transport: Transport, names: Names, *, limit: int = 500, hooks: Hooks = NO_HOOKS
) -> int:
    """Publish up to `limit` unpublished events as one batch; returns how many were relayed.

    The rows stay locked until the batch is confirmed and they are marked, in one transaction.
    """
    return relay_pass(engine, transport, names, limit=limit, hooks=hooks).relayed


def relay_pass(
    engine: Engine, transport: Transport, names: Names, *, limit: int = 500, hooks: Hooks = NO_HOOKS
) -> Pass:
    """`relay_events`, telling also whether the pass held events back (its transaction has
    ended: they can be taken again)."""
    started = time.monotonic()
    with transaction(engine) as conn:
        batch, held_back = _Batch.take(conn, names, limit)
        if batch is None:
            return Pass(0, held_back)
        batch.settle(conn, transport.publish_many(batch.messages), names)
    hooks.events_relayed(len(batch.event_ids), time.monotonic() - started)
    return Pass(len(batch.event_ids), held_back)


class _Batch:
    """Unpublished events locked by one relay transaction, and their messages."""

    def __init__(self, rows: Sequence[Any], names: Names, *, held_back: bool) -> None:
        self.held_back = held_back
        """Its transaction holds back events (locked, unpublished) until it ends."""
        self.event_ids = [r.id for r in rows]
        self.messages: list[Outgoing] = []
        self.owners: list[int] = []
        self.feed: list[stream.FeedEvent] = []
        for row in rows:
            body = StatusEvent(
                event_id=row.id,
                run_id=row.run_id,
                key=row.business_key,
                workflow=row.workflow,
                version=row.version,
                entity=row.entity,
                step=row.step,
                state=row.to_state,
                previous=row.from_state,
                attempt=row.attempt,
                at=row.created_at.isoformat(),
                reason=row.reason,
                detail=row.detail,
            ).encode()
            headers = {"run_id": row.run_id, "key": row.business_key}
            self.messages.append(
                Outgoing(
                    names.status, routing_key(row.workflow, row.entity, row.to_state), body, headers
                )
            )
            self.owners.append(row.id)
            if row.reply_to:
                self.messages.append(Outgoing("", row.reply_to, body, headers))
                self.owners.append(row.id)
            cancel = _cancel(row)
            if cancel is not None:
                self.messages.append(
                    Outgoing(names.control, cancel.agent, cancel.encode(), headers)
                )
                self.owners.append(row.id)
            self.feed.append(_feed_event(row))

    @classmethod
    def take(cls, conn: Connection, names: Names, limit: int) -> tuple[_Batch | None, bool]:
        """The batch (None when there is nothing to publish), and whether events were held
        back."""
        taken = events.take_unpublished(conn, limit=limit)
        batch = cls(taken.rows, names, held_back=taken.held_back) if taken.rows else None
        return batch, taken.held_back

    def settle(self, conn: Connection, results: Sequence[Exception | None], names: Names) -> None:
        """Mark the batch published and queue it for the stream, once the broker settled it."""
        for event_id, result in zip(self.owners, results, strict=True):
            if isinstance(result, BrokerUnavailableError):
                raise result  # not sent: nothing is marked, the next relay publishes again
            if result is not None:
                # Refused for good (e.g. too large): one bad event must not block the others.
                log.error("status event %s not published: %s", event_id, result)
        events.mark_published(conn, self.event_ids)
        stream.fan_out(conn, self.feed, namespace=names.namespace)


@dataclass
class _InFlight:
    """A batch published without waiting: its transaction stays open (the rows locked) until
    the broker's confirms arrive and it is marked and committed."""

    conn: Connection
    batch: _Batch
    ticket: PublishTicket
    started: float


class Relay:
    """The scheduler's relay: `relay_events` without the wait for the broker's confirms in
    its loop, where the transport can publish without waiting (`AsyncPublisher`) and the
    database lock rows across the wait (PostgreSQL; SQLite relays as `relay_events` does).

    `start` locks and publishes a batch and returns; `poll` marks and commits the batches
    whose confirms have arrived, oldest first, so the stream's fan-out keeps the events'
    order. What is marked, when and in which transaction, and the at-least-once delivery are
    those of `relay_events`: a batch whose confirms never come (lost broker or database) is
    rolled back and published again by the next relay.
    """

    MAX_IN_FLIGHT = 3
    """Batches awaiting confirms, each holding a pooled connection (fewer when the pool is
    smaller: with a pool of one, every batch waits for its confirms)."""

    def __init__(
        self,
        engine: Engine,
        transport: Transport,
        names: Names,
        *,
        limit: int = 500,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        self._engine = engine
        self._transport = transport
        self._names = names
        self._limit = limit
        self._hooks = hooks
        # The loop needs one connection of its own besides the batches in flight.
        self._max_in_flight = min(self.MAX_IN_FLIGHT, pool_capacity(engine) - 1)
        self._async = (
            isinstance(transport, AsyncPublisher)
            and capabilities(engine).relay_in_flight
            and self._max_in_flight > 0
        )
        self._in_flight: deque[_InFlight] = deque()
        self._sync_next = False
        self._held_back = False

    @property
    def in_flight(self) -> bool:
        return bool(self._in_flight)

    @property
    def held_back(self) -> bool:
        """A transaction of this relay that held events back has ended since its last pass
        took events: they can be taken now, or as soon as their predecessor is published,
        so pass again soon (RelayDuty does). The next pass clears it (and sets it again if it
        holds them back again)."""
        return self._held_back

    def start(self) -> int:
        """Publish up to `limit` unpublished events; returns how many. Batches in flight are
        marked after this one went out (they were published before it, so the order holds)."""
        publisher = self._transport
        # A batch in flight holds a pooled connection until its confirms arrive: only when the
        # pool can spare one besides a connection for the others that share it (the roles of
        # `sasflow run` share one pool); else this pass waits for its confirms.
        crowded = self._async and spare_connections(self._engine) < 2
        if (
            not isinstance(publisher, AsyncPublisher)
            or not self._async
            or self._sync_next
            or crowded
        ):
            self.flush()
            self._held_back = False  # this pass sees what the batches flushed held back
            relayed = relay_pass(
                self._engine, self._transport, self._names, limit=self._limit, hooks=self._hooks
            )
            self._sync_next = False
            self._held_back = relayed.held_back
            return relayed.relayed
        if len(self._in_flight) >= self._max_in_flight:
            self._finish(wait=True)
        started = time.monotonic()
        with translated(self._engine):
            conn = self._engine.connect()
        try:
            self._held_back = False  # set again below if held back by this pass or one in flight
            with translated(self._engine):
                conn.begin()
                batch, held_back = _Batch.take(conn, self._names, self._limit)
            if batch is None:
                self._close(conn)
                self._held_back = held_back
                self.poll()
                return 0
            ticket = publisher.publish_nowait(batch.messages)
        except BaseException:
            self._close(conn)
            raise
        self._in_flight.append(_InFlight(conn, batch, ticket, started))
        self.poll()
        return len(batch.event_ids)

    def poll(self) -> None:
        """Mark and commit the oldest batches whose confirms have arrived."""
        while self._in_flight and self._finish(wait=False):
            pass

    def flush(self) -> None:
        """Wait for every batch's confirms, then mark and commit them (on stop)."""
        while self._in_flight:
            self._finish(wait=True)

    def abandon(self) -> None:
        """Roll back every batch in flight (the broker connection, or a batch's transaction,
        is gone): the next relay publishes their events again. The transport forgets their
        tags, so their confirms, still to come on a channel that lives on, are kept for no
        one."""
        publisher = cast(AsyncPublisher, self._transport)
        while self._in_flight:
            gone = self._in_flight.popleft()
            self._close(gone.conn)
            publisher.forget(gone.ticket)

    def _finish(self, *, wait: bool) -> bool:
        head = self._in_flight[0]
        publisher = cast(AsyncPublisher, self._transport)
        try:
            results = publisher.settled(head.ticket, wait=wait)
            if results is None:
                return False
            self._in_flight.popleft()
            with translated(self._engine):
                head.batch.settle(head.conn, results, self._names)
                head.conn.commit()
        except BaseException:
            # A later batch must not be marked before this one is published again (the stream
            # keeps each run's order): every batch in flight goes back.
            self._close(head.conn)
            publisher.forget(head.ticket)  # its confirms may have arrived, not taken
            self.abandon()
            self._sync_next = True  # e.g. a message the broker refused by closing the channel
            raise
        self._close(head.conn)
        self._held_back = self._held_back or head.batch.held_back
        self._hooks.events_relayed(len(head.batch.event_ids), time.monotonic() - head.started)
        return True

    @staticmethod
    def _close(conn: Connection) -> None:
        with contextlib.suppress(Exception):  # a lost connection cannot roll back; it is dropped
            conn.close()


def _cancel(row: Any) -> Cancel | None:
    """The agent's `Cancel` of a step's event, if it cancelled an attempt in flight."""
    detail = row.detail
    if not (
        row.entity == "step"
        and row.from_state == StepState.PROCESSING
        and row.to_state == StepState.CANCELLED
        and row.step_id is not None
        and row.attempt is not None
        and isinstance(detail, dict)
        and isinstance(detail.get(events.CANCEL_AGENT_KEY), str)
    ):
        return None
    try:
        return Cancel(
            step_id=row.step_id,
            run_id=row.run_id,
            attempt=row.attempt,
            agent=detail[events.CANCEL_AGENT_KEY],
            reason=None if row.reason is None else safe_text(row.reason),
            event_id=row.id,
        )
    except ValidationError:  # one bad row must not block the outbox: its status goes out
        log.exception("event %s: no cancel sent to its agent", row.id)
        return None


def _feed_event(row: Any) -> stream.FeedEvent:
    """The subscription stream's UPDATE of one event (its `uuid` is added per subscriber)."""
    body: dict[str, Any] = {
        "run": row.run_id,
        "workflow": row.workflow,
        "key": row.business_key,
        "entity": row.entity,
        "state": row.to_state,
        "previous": row.from_state,
        "at": row.created_at.isoformat(),
        "event_id": row.id,
    }
    if row.step is not None:
        body["step"] = row.step
    if row.reason is not None:
        body["reason"] = row.reason
    return stream.FeedEvent(row.run_id, row.workflow, row.submitted_by, body)
