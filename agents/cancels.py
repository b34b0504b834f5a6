"""Cancels of running steps, sent by the relay on the control exchange (docs/protocol.md):
which attempt a cancel stops here, and the attempts cancelled lately, so a request of one that
arrives after its cancel (it waited in the queue) is never run.

Every instance of the agent receives each cancel, on a queue of its own bound to `<ns>.control`
with the agent's name, kept for the process's lifetime: a cancel published while the process
reconnects waits there and is acted on once it is back (if back within the queue's expiry).
Fenced: a cancel acts only on a job running exactly its (step id, attempt); a stale one (an
earlier attempt) or one for another instance's attempt changes nothing here. Acting means:
`call.cancelled` is set (retries stop, handlers that poll it return), `call.aborted` too (the
programs of `Call.run` get SIGTERM, then SIGKILL after their grace; an `async def` handler's
task is cancelled), and the job is `revoked`: whatever its handler returns, no reply is sent
(the database ended the attempt `cancelled` when the cancel was made; a reply would be fenced
out anyway) and its request is acknowledged.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping

from sasflow.agents.jobs import AgentStats, Job
from sasflow.errors import BrokerUnavailableError, InvalidMessageError
from sasflow.messages import Cancel, Request, parse
from sasflow.transport.base import Delivery, Transport
from sasflow.transport.topology import Names, declare_control_queue

log = logging.getLogger(__name__)

REMEMBERED = 10_000
"""Cancelled attempts an agent process remembers (the oldest forgotten first)."""
CONTROL_PREFETCH = 50
"""Cancels an agent process takes from its control queue at once."""

JobKey = tuple[int, int]


class Cancels:
    """The cancels one agent process receives (owner thread only)."""

    def __init__(
        self,
        instance_id: str,
        agent: str,
        transport: Transport,
        *,
        names: Names,
        jobs: Mapping[JobKey, Job],
        stats: AgentStats,
        dead_letter: Callable[[Delivery, str], None],
        remembered: int = REMEMBERED,
    ) -> None:
        """`jobs`: the process's jobs by (step id, attempt); `dead_letter`: how it dead-letters
        a message it cannot parse."""
        self._instance_id = instance_id
        self._agent = agent
        self._transport = transport
        self._names = names
        self._jobs = jobs
        self._stats = stats
        self._dead_letter = dead_letter
        self._remembered = remembered
        self._seen: OrderedDict[JobKey, None] = OrderedDict()
        self._connections = 0

    def connected(self) -> None:
        """After each (re)connection: consume this process's control queue, the same one for
        its lifetime, so a cancel published while it was between connections waits there for
        it (the broker deletes the queue only once unused for CONTROL_QUEUE_EXPIRES_MS). If
        that queue cannot be declared again (on a cluster, a classic queue whose node is down),
        a queue of this connection's own is consumed instead, as the breakers do
        (sasflow.agents.fleet): cancels published before it are then lost to this process."""
        self._connections += 1
        process = self._instance_id.rpartition(":")[2]
        try:
            queue = declare_control_queue(self._transport, self._names, self._agent, process)
        except BrokerUnavailableError as exc:
            if self._connections == 1:
                raise
            log.warning(
                "control queue of %s cannot be declared again (%s): using one of this "
                "connection's own; cancels sent while disconnected are lost here",
                self._instance_id,
                exc,
            )
            suffix = f"{process}-{self._connections}"
            queue = declare_control_queue(self._transport, self._names, self._agent, suffix)
        self._transport.consume(queue, self.on_cancel, prefetch=CONTROL_PREFETCH)

    def on_cancel(self, delivery: Delivery) -> None:
        try:
            cancel = parse(Cancel, delivery.body)
        except InvalidMessageError as exc:
            self._dead_letter(delivery, str(exc))
            return
        self._transport.ack(delivery)
        if cancel.agent == self._agent and self.received(cancel) is not None:
            self._stats.cancelled += 1

    def received(self, cancel: Cancel) -> Job | None:
        """Stop the job running `cancel`'s attempt, if one runs here; returns it (None: no such
        attempt runs here, or it was stopped already)."""
        key = (cancel.step_id, cancel.attempt)
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        job = self._jobs.get(key)
        if job is None or job.abandoned or job.revoked:
            return None
        job.revoked = True
        job.call.cancelled.set()
        job.call.aborted.set()
        log.warning(
            "step %s attempt %s cancelled while it ran here (%s): handler told, programs stopped",
            cancel.step_id,
            cancel.attempt,
            cancel.reason or "no reason given",
        )
        return job

    def cancelled(self, step_id: int, attempt: int) -> bool:
        """Whether that attempt was cancelled (a request of it is not to be run)."""
        return (step_id, attempt) in self._seen

    def came_first(self, request: Request, delivery: Delivery) -> bool:
        """Whether `request`'s attempt was cancelled before it arrived: then it is acknowledged
        and never run."""
        if not self.cancelled(request.step_id, request.attempt):
            return False
        self._transport.ack(delivery)
        self._stats.cancelled += 1
        log.info(
            "step %s attempt %s: cancelled before it reached this agent: not run",
            request.step_id,
            request.attempt,
        )
        return True
