"""Agent pools at dispatch: a claimed step whose pool has no live agent is not sent into the
void. The scheduler asks the broker how many consumers the pool's queue has (once per pass
and pool); steps of an empty pool are handed back to wait (`store.pools.park`) and looked at
again on a later pass, and fail with `no agent in pool P` once past the limits."""

from __future__ import annotations

from collections.abc import Sequence

from sasflow.store.runs.claim import ClaimedStep
from sasflow.transport.base import Transport
from sasflow.transport.topology import Names, declare_agent_queue


class PoolGate:
    """Which claimed steps may be dispatched now. Owned by the scheduler's thread."""

    def __init__(self, transport: Transport, names: Names) -> None:
        self._transport = transport
        self._names = names
        self._declared: set[str] = set()

    def reset(self) -> None:
        """Forget the declared queues (after a reconnection)."""
        self._declared.clear()

    def split(self, claimed: Sequence[ClaimedStep]) -> tuple[list[ClaimedStep], list[ClaimedStep]]:
        """(steps to dispatch, steps whose pool queue has no consumer now)."""
        live: dict[str, bool] = {}
        ready: list[ClaimedStep] = []
        waiting: list[ClaimedStep] = []
        for step in claimed:
            if step.pool is None:
                ready.append(step)
                continue
            queue = self._names.pool(step.agent, step.pool)
            if queue not in live:
                if queue not in self._declared:
                    declare_agent_queue(self._transport, self._names, step.agent, step.pool)
                    self._declared.add(queue)
                live[queue] = self._transport.consumer_count(queue) > 0
            (ready if live[queue] else waiting).append(step)
        return ready, waiting
