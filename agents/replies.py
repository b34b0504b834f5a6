"""How an agent process answers: replies made (`make_reply`) and published (`ReplySender`).

Everything here but `make_reply` runs on the worker's owner thread. Replies are published as
one batch, mandatory and confirmed; their requests are acknowledged after the broker took them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import Any

from sasflow.agents.jobs import AgentStats, Job, Outcome
from sasflow.errors import BrokerUnavailableError, UnroutableError
from sasflow.messages import ErrorInfo, Reply, Request, safe_text
from sasflow.runtime import Reconnect
from sasflow.states import ReplyStatus
from sasflow.transport.base import Outgoing, Transport
from sasflow.transport.topology import Names, declare_common

log = logging.getLogger(__name__)

MAX_DEFER_SECONDS = 86400.0
"""Longest deferral an agent asks for; the step's give-up age bounds the total anyway."""


def make_reply(agent: str, request: Request, status: ReplyStatus, **fields: Any) -> Reply:
    """The reply of `agent` to `request` (any thread): deferral capped, error texts made safe."""
    if "defer_seconds" in fields:
        fields["defer_seconds"] = min(fields["defer_seconds"], MAX_DEFER_SECONDS)
    error = fields.get("error")
    if isinstance(error, ErrorInfo):
        fields["error"] = error.model_copy(
            update={"type": safe_text(error.type, 200), "message": safe_text(error.message)}
        )
    return Reply.model_validate(
        {
            "step_id": request.step_id,
            "attempt": request.attempt,
            "status": status,
            "agent": agent,
            **fields,
        }
    )


JobKey = tuple[int, int]


class ReplySender:
    """Publishes the replies of one agent process and acknowledges their requests."""

    def __init__(
        self,
        agent: str,
        transport: Transport,
        names: Names,
        stats: AgentStats,
        jobs: MutableMapping[JobKey, Job],
    ) -> None:
        """`jobs`: the process's jobs by (step id, attempt); a job answered leaves it."""
        self._agent = agent
        self._transport = transport
        self._names = names
        self._stats = stats
        self._jobs = jobs
        self._held: list[Outcome] = []
        """Replies the broker returned, published again at `_retry_at`."""
        self._retry_at = 0.0
        self._retry_backoff = Reconnect(initial=0.5, maximum=5.0)

    @property
    def retry_at(self) -> float | None:
        """When held replies are next published (monotonic), None when none is held."""
        return self._retry_at if self._held else None

    def due(self) -> list[Outcome]:
        """The held replies whose retry is due: taken back, to be finished again."""
        if not self._held or time.monotonic() < self._retry_at:
            return []
        due, self._held = self._held, []
        for outcome in due:
            outcome.job.held = False
        return due

    def finish(self, outcomes: list[Outcome]) -> None:
        """Publish the replies of finished jobs as one batch, then ack their requests.

        Replies are mandatory: one the broker returns (its queue is gone) is sent again after
        the namespace's queues are declared again, and if it comes back once more it is held,
        its request unacked, and retried until the step's deadline (`_hold`). Raises
        BrokerUnavailableError when the connection fails (then nothing may be assumed sent)."""
        done: list[Job] = []
        sending: list[Outcome] = []
        for outcome in outcomes:
            job = outcome.job
            if job.abandoned:
                continue
            if job.handed_back:  # not started: another process runs it (agents.handback)
                self._jobs.pop((job.request.step_id, job.request.attempt), None)
                if self._transport.requeue(job.delivery):
                    self._stats.handed_back += 1
                continue
            done.append(job)
            if outcome.reply is not None and time.monotonic() < job.call.deadline:
                sending.append(outcome)
        refused = self._send(sending)
        if any(isinstance(exc, UnroutableError) for _, exc in refused):
            # `<ns>.replies` was deleted (or lost with its node) since we declared it.
            declare_common(self._transport, self._names)
            returned = [o for o, exc in refused if isinstance(exc, UnroutableError)]
            refused = [r for r in refused if not isinstance(r[1], UnroutableError)]
            refused += self._send(returned)
        # Refused for good (e.g. too large): report that instead.
        instead = [
            Outcome.of(
                outcome.job,
                make_reply(
                    self._agent,
                    outcome.job.request,
                    ReplyStatus.ERROR,
                    error=ErrorInfo(
                        type="PublishError", message=f"the broker refused the reply: {exc}"
                    ),
                ),
            )
            for outcome, exc in refused
            if not isinstance(exc, UnroutableError)
        ]
        held = [o for o, exc in refused if isinstance(exc, UnroutableError)]
        unsent: list[Outcome] = []
        for outcome, exc in self._send(instead):
            (held if isinstance(exc, UnroutableError) else unsent).append(outcome)
        for outcome in unsent:  # not even the error fits: the step's deadline will tell
            log.error(
                "step %s: the broker refused the error reply too", outcome.job.request.step_id
            )
        self._hold(held)
        # No reply, or finished too late, or refused twice: the pattern says stay silent.
        self._stats.silent += len(done) - len(sending) + len(unsent)
        for job in done:
            if job.held:
                continue
            self._jobs.pop((job.request.step_id, job.request.attempt), None)
            if not job.acked:
                self._transport.ack(job.delivery)

    def _hold(self, outcomes: list[Outcome]) -> None:
        """Keep replies the broker returned even after the queues were declared again (a
        `reply_to` queue that is not ours, or deleted again): their requests stay unacked,
        and they are published again after a backoff until the step's deadline, when the
        pattern's silence applies. Neither is the reply lost nor the handler run again
        (nacking the request would run it twice), unless this process ends meanwhile."""
        for outcome in outcomes:
            outcome.job.held = True
            self._held.append(outcome)
            log.error(
                "step %s attempt %s: the reply to %s was returned (no such queue); keeping the "
                "request and retrying until its deadline",
                outcome.job.request.step_id,
                outcome.job.request.attempt,
                outcome.job.delivery.reply_to or self._names.replies,
            )
        if outcomes:
            self._retry_at = time.monotonic() + self._retry_backoff.next_delay()
        elif not self._held:
            self._retry_backoff.reset()

    def _send(self, sending: list[Outcome]) -> list[tuple[Outcome, Exception]]:
        """Publish replies as one batch (mandatory); count those confirmed, return those
        refused (an UnroutableError: returned by the broker)."""
        if not sending:
            return []
        results = self._transport.publish_many(
            [
                Outgoing(
                    exchange="",
                    routing_key=outcome.job.delivery.reply_to or self._names.replies,
                    body=outcome.body,
                    correlation_id=outcome.job.delivery.correlation_id,
                    headers=outcome.job.reply_headers,
                    mandatory=True,
                )
                for outcome in sending
            ]
        )
        refused: list[tuple[Outcome, Exception]] = []
        for outcome, result in zip(sending, results, strict=True):
            reply = outcome.reply
            if isinstance(result, BrokerUnavailableError):
                raise result  # not sent: every outcome is published again after reconnecting
            if result is None:
                if reply is not None:
                    self._count(reply)
            else:
                log.error(
                    "step %s: the broker refused the %s reply: %s",
                    outcome.job.request.step_id,
                    reply.status if reply is not None else "",
                    result,
                )
                refused.append((outcome, result))
        return refused

    def _count(self, reply: Reply) -> None:
        if reply.status is ReplyStatus.OK:
            self._stats.replied_ok += 1
        elif reply.status is ReplyStatus.DEFERRED:
            self._stats.deferred += 1
        elif reply.status is ReplyStatus.FAILED:
            self._stats.replied_failed += 1
        else:
            self._stats.replied_error += 1
