"""What a namespace holds on the broker, and its removal (`sasflow namespace delete`).

AMQP cannot list queues, so the namespace's queues and exchanges are named from what sasflow
declares (engine/transport/topology.py) and the agents (and pools) the caller knows of: the
app's, the store's, and those given. Each is looked up passively: what does not exist is
left out. Removal is refused while any of its queues has a consumer (stop the roles first).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sasflow.errors import ConfigurationError
from sasflow.transport.admin import BrokerAdmin, QueueState
from sasflow.transport.topology import Names


class NamespaceInUseError(ConfigurationError):
    """A queue of the namespace has consumers: stop every role of it first."""


@dataclass(frozen=True)
class Contents:
    """The namespace's queues that exist (with their state) and exchanges that exist."""

    queues: dict[str, QueueState]
    exchanges: list[str]

    @property
    def busy(self) -> list[str]:
        return [f"{q} ({s.consumers})" for q, s in self.queues.items() if s.consumers]


def queue_names(names: Names, agent_queues: Iterable[tuple[str, str | None]]) -> list[str]:
    pairs = sorted(set(agent_queues), key=lambda p: (p[0], p[1] or ""))
    agents = sorted({agent for agent, _ in pairs})
    pools = [names.pool(agent, pool) for agent, pool in pairs if pool is not None]
    return [*names.all_queues(agents), *pools]


def exchange_names(names: Names, agents: Iterable[str]) -> list[str]:
    common = [names.status, names.alerts, names.dead_letter_exchange, names.fleet, names.control]
    return [*common, *(names.breakers(agent) for agent in sorted(set(agents)))]


def contents(
    admin: BrokerAdmin, names: Names, agent_queues: Iterable[tuple[str, str | None]]
) -> Contents:
    pairs = list(agent_queues)
    queues = {}
    for queue in queue_names(names, pairs):
        state = admin.queue_state(queue)
        if state is not None:
            queues[queue] = state
    exchanges = [
        e for e in exchange_names(names, (a for a, _ in pairs)) if admin.exchange_exists(e)
    ]
    return Contents(queues, exchanges)


def delete(admin: BrokerAdmin, found: Contents) -> None:
    """Delete what `found` lists; NamespaceInUseError (nothing deleted) when a queue has
    consumers."""
    if found.busy:
        raise NamespaceInUseError(
            "stop every sasflow role of the namespace first; these queues have consumers: "
            + ", ".join(found.busy)
        )
    with admin.channel() as ch:
        for queue in found.queues:
            ch.queue_delete(queue)
        for exchange in found.exchanges:
            ch.exchange_delete(exchange)
