"""Queue types: which arguments declare a queue on RabbitMQ.

The durable work queues (submissions, replies, agent and pool requests, dead letters, and the
fleet's heartbeats, which every role declares when it connects) take the deployment's queue
type: `classic` (the default, a queue living on one node) or `quorum` (the
replicated type, the production choice on a cluster: docs/howto/production-topology.md). A
quorum work queue that dead-letters does so at least once (`x-dead-letter-strategy`, which needs
`x-overflow: reject-publish`), since the supervisor counts dead-lettered requests, and redelivers
a message at most `delivery_limit` times before dead-lettering it (a request that crashes every
agent that takes it ends as a counted failure, not a crash loop). Each agent instance's breaker
queue, temporary by design, is always declared `classic`, by name, so a virtual host whose
default queue type is quorum does not turn it into a queue that refuses `x-expires`-style use.

A queue's type cannot be changed in place: `sasflow queues migrate` moves a deployment's
messages (sasflow.transport.migration).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class QueueType(StrEnum):
    CLASSIC = "classic"
    QUORUM = "quorum"


DEFAULT_DELIVERY_LIMIT = 10
"""Deliveries of one message a quorum work queue allows before dead-lettering it (the
default of SASFLOW_BROKER_DELIVERY_LIMIT too)."""


@dataclass(frozen=True)
class QueueOptions:
    """How the work queues are declared (from Settings at the CLI; defaults here)."""

    type: QueueType = QueueType.CLASSIC
    replicas: int | None = None
    """Quorum queues: replicas of each new queue (`x-quorum-initial-group-size`); None: the
    broker's default."""
    delivery_limit: int | None = DEFAULT_DELIVERY_LIMIT
    """Quorum queues: deliveries of one message before it is dead-lettered; None: no limit."""


TYPE_ARGUMENTS = (
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
    "x-dead-letter-strategy",
    "x-overflow",
)
"""The arguments the queue type settings decide. A work queue that exists with other values
of these (declared under earlier settings) is used as it is, with a warning, rather than
refused: a process whose settings changed before the queues were migrated keeps working."""


def type_mismatch(reply_text: str) -> bool:
    """Whether the broker's PRECONDITION_FAILED text names one of TYPE_ARGUMENTS."""
    return any(f"arg '{argument}'" in reply_text for argument in TYPE_ARGUMENTS)


def queue_arguments(
    options: QueueOptions,
    *,
    work: bool,
    dead_letter_exchange: str | None,
    max_length: int | None = None,
    expires_ms: int | None = None,
) -> dict[str, Any]:
    """The `queue.declare` arguments of one queue; `work`: a durable work queue (the
    deployment's type), else an explicitly classic one."""
    arguments: dict[str, Any] = {}
    quorum = work and options.type is QueueType.QUORUM
    arguments["x-queue-type"] = QueueType.QUORUM.value if quorum else QueueType.CLASSIC.value
    if dead_letter_exchange is not None:
        arguments["x-dead-letter-exchange"] = dead_letter_exchange
    if max_length is not None:
        arguments["x-max-length"] = max_length
        arguments["x-overflow"] = "drop-head"
    if expires_ms is not None:
        arguments["x-expires"] = expires_ms
    if quorum:
        if options.replicas is not None:
            arguments["x-quorum-initial-group-size"] = options.replicas
        if options.delivery_limit is not None:
            arguments["x-delivery-limit"] = options.delivery_limit
        if dead_letter_exchange is not None and max_length is None:
            # At-least-once dead-lettering needs reject-publish; a bounded queue drops its
            # oldest instead and dead-letters at most once (none of ours dead-letters).
            arguments["x-dead-letter-strategy"] = "at-least-once"
            arguments["x-overflow"] = "reject-publish"
    return arguments
