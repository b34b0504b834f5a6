"""Move a deployment's work queues to another queue type (`sasflow queues migrate`).

RabbitMQ cannot change a queue's type in place, so each work queue Q is moved through a
holding queue `Q.migrating` declared with the target arguments and the same bindings:

1. Q is redeclared with the target arguments: when the broker accepts it, Q already has that
   type (or did not exist and now does), and only step 5 remains.
2. Otherwise the holding queue is declared and bound like Q (dead letters the broker routes
   while Q is gone land there), and every message of Q is moved into it: `basic.get`,
   published to the holding queue with the same properties and body (mandatory, confirmed),
   then acknowledged on Q. A message is acknowledged only after the broker confirmed its copy.
3. Q is deleted only if empty (a message that arrived meanwhile is moved in another round).
4. Q is declared with the target arguments and bound again.
5. The holding queue's messages are moved back into Q, and the holding queue is deleted (if
   empty).

A crash at any point loses nothing and the command can be run again: a message is always in
Q, in the holding queue, or (between a confirm and an ack) in both, a duplicate the engine's
fencing absorbs (a request's attempt, a reply's attempt, a submission's idempotency key).
The roles must be stopped: the command refuses a queue that has consumers. A producer that
publishes to Q by name while Q is deleted gets its message back (sasflow publishes mandatory),
and the order of messages in Q is kept; the move restarts a message's time-to-live.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions

from sasflow.errors import ConfigurationError
from sasflow.transport.admin import BrokerAdmin
from sasflow.transport.connection import BrokerOptions
from sasflow.transport.queues import QueueOptions, QueueType, queue_arguments
from sasflow.transport.rabbitmq import PRECONDITION_FAILED
from sasflow.transport.topology import DEAD_REQUESTS_MAX, FLEET_MAX, Names

log = logging.getLogger(__name__)

HOLDING_SUFFIX = ".migrating"


class MigrationRefusedError(ConfigurationError):
    """A queue still has consumers: stop the roles first."""


@dataclass(frozen=True)
class WorkQueue:
    """One work queue as the topology declares it."""

    name: str
    dead_letter_exchange: str | None
    max_length: int | None = None
    bindings: tuple[tuple[str, str], ...] = ()
    """(exchange, routing key) pairs it is bound with."""


@dataclass(frozen=True)
class Moved:
    """What the migration did to one queue."""

    queue: str
    changed: bool
    """False: it already had the target type."""
    messages: int
    """Messages moved into the new queue (including those left by an interrupted run)."""


def work_queues(names: Names, agent_queues: Sequence[str]) -> list[WorkQueue]:
    """The namespace's work queues (sasflow.transport.topology.declare_common and
    declare_agent_queue), the agent and pool queues named by `agent_queues`."""
    dlx = names.dead_letter_exchange
    return [
        WorkQueue(names.submit, dlx),
        WorkQueue(names.replies, dlx),
        WorkQueue(names.dead_letter_queue, None, bindings=((dlx, "#"),)),
        WorkQueue(
            names.dead_requests,
            None,
            max_length=DEAD_REQUESTS_MAX,
            bindings=((dlx, f"{names.namespace}.agent.#"),),
        ),
        WorkQueue(names.fleet, None, max_length=FLEET_MAX, bindings=((names.fleet, "#"),)),
        *(WorkQueue(queue, dlx) for queue in sorted(set(agent_queues))),
    ]


class QueueMigration(BrokerAdmin):
    """One connection to the broker, moving work queues to `target`'s type."""

    def __init__(self, url: str, options: BrokerOptions, target: QueueOptions) -> None:
        super().__init__(url, options)
        self._target = target

    def __enter__(self) -> QueueMigration:
        super().__enter__()
        return self

    def check_idle(self, queues: Sequence[WorkQueue]) -> None:
        """MigrationRefusedError if any existing queue of `queues` has a consumer."""
        busy = []
        for queue in queues:
            for name in (queue.name, queue.name + HOLDING_SUFFIX):
                consumers = self.consumers(name)
                if consumers:
                    busy.append(f"{name} ({consumers})")
        if busy:
            raise MigrationRefusedError(
                "stop every sasflow role first; these queues have consumers: " + ", ".join(busy)
            )

    def migrate(self, queue: WorkQueue) -> Moved:
        """Move one queue to the target type (see the module doc)."""
        holding = queue.name + HOLDING_SUFFIX
        changed = not self._declare(queue.name, queue)
        if changed:
            self._declare_or_fail(holding, queue)
            for exchange, key in queue.bindings:
                self._channel_call(lambda ch, e=exchange, k=key: ch.queue_bind(holding, e, k))
            source_quorum = self._target.type is not QueueType.QUORUM
            while True:
                self._move(queue.name, holding)
                if self._delete_if_empty(queue.name, quorum=source_quorum):
                    break  # else a message arrived meanwhile: move again
            self._declare_or_fail(queue.name, queue)
            for exchange, key in queue.bindings:
                self._channel_call(lambda ch, e=exchange, k=key: ch.queue_bind(queue.name, e, k))
        moved = 0
        if self.consumers(holding) is not None:  # also what an interrupted run left behind
            for exchange, key in queue.bindings:
                self._channel_call(lambda ch, e=exchange, k=key: ch.queue_unbind(holding, e, k))
            holding_quorum = self._target.type is QueueType.QUORUM
            while True:
                moved += self._move(holding, queue.name)
                if self._delete_if_empty(holding, quorum=holding_quorum):
                    break
        log.info(
            "queue %s: %s, %d messages moved",
            queue.name,
            "migrated" if changed else "already of the target type",
            moved,
        )
        return Moved(queue.name, changed, moved)

    # -- broker operations ---------------------------------------------------------------

    def _arguments(self, queue: WorkQueue) -> dict[str, Any]:
        return queue_arguments(
            self._target,
            work=True,
            dead_letter_exchange=queue.dead_letter_exchange,
            max_length=queue.max_length,
        )

    def _declare(self, name: str, queue: WorkQueue) -> bool:
        """Declare `name` with the target arguments; False if it exists with others."""
        try:
            with self.channel() as ch:
                ch.queue_declare(name, durable=True, arguments=self._arguments(queue))
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == PRECONDITION_FAILED:
                return False
            raise
        return True

    def _declare_or_fail(self, name: str, queue: WorkQueue) -> None:
        if not self._declare(name, queue):
            raise ConfigurationError(
                f"queue {name} exists with arguments other than the target's: delete it or "
                "migrate to its type"
            )

    def _delete_if_empty(self, name: str, *, quorum: bool) -> bool:
        """Delete `name` if it holds no message; False if it does. Quorum queues refuse
        `if-empty`, so theirs is a count, then a delete: only producers the operator was told
        to stop could slip a message in between."""
        if quorum:
            with self.channel() as ch:
                if ch.queue_declare(name, passive=True).method.message_count:
                    return False
                ch.queue_delete(name)
            return True
        try:
            with self.channel() as ch:
                ch.queue_delete(name, if_empty=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != PRECONDITION_FAILED:
                raise
            return False
        return True

    def _move(self, source: str, target: str) -> int:
        """Move every message of `source` into `target`; returns how many."""
        moved = 0
        with self.channel() as ch:
            ch.confirm_delivery()
            while True:
                method, properties, body = ch.basic_get(source, auto_ack=False)
                if method is None or method.delivery_tag is None or body is None:
                    return moved
                ch.basic_publish("", target, body, properties, mandatory=True)
                ch.basic_ack(method.delivery_tag)
                moved += 1

    def _channel_call(self, call: Any) -> None:
        with self.channel() as ch:
            call(ch)
