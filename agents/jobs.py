"""What an agent process keeps of each request while a worker thread runs it, and what it
counts: the job, its outcome (the reply encoded off the owner thread), the process's counters,
and the share of a step's budget in which retries may start."""

from __future__ import annotations

from dataclasses import dataclass

from sasflow.agents.agent import Call
from sasflow.agents.children import ChildProcesses
from sasflow.errors import InvalidMessageError
from sasflow.hooks import Headers
from sasflow.messages import (
    DEFAULT_LIMITS,
    ErrorInfo,
    Limits,
    Reply,
    Request,
    encode_within,
    safe_text,
)
from sasflow.states import ReplyStatus
from sasflow.transport.base import Delivery


@dataclass
class Job:
    delivery: Delivery
    request: Request
    call: Call
    done: bool = False
    abandoned: bool = False
    held: bool = False
    """Its reply was returned by the broker: kept, and published again (`AgentWorker._hold`)."""
    reply_headers: Headers | None = None
    begun: bool = False
    """A worker took it (its execution clock runs: sasflow.agents.progress)."""
    started_due: float = 0.0
    """When its `started` is to be sent if no reply is ready by then (monotonic)."""
    announced: bool = False
    """Its `started` was sent."""
    received: float = 0.0
    """When this process received the request (monotonic)."""
    start_confirmed: bool = False
    """The broker confirmed its `started` message."""
    acked: bool = False
    """Its request was acknowledged when it started (sasflow.agents.acks): not again."""
    taken: bool = False
    """A worker thread took it (sasflow.agents.handback): it can no longer be handed back."""
    handed_back: bool = False
    """Given back to the broker unstarted (requeued) for another process: never run here."""
    revoked: bool = False
    """Its attempt was cancelled (sasflow.agents.cancels): stopped, and never replied to."""
    latest_end: float | None = None
    """A redelivered exclusive request: when its attempt must end here at the latest, its
    claim plus its budget (monotonic; sasflow.agents.redelivery)."""

    @classmethod
    def received_at(
        cls, received: float, delivery: Delivery, request: Request, children: ChildProcesses
    ) -> Job:
        """The job of a request received at `received` (monotonic). Until a worker takes it
        (progress.start times the budget from then), its deadline is the whole envelope: the
        wait, then the execution."""
        call = Call(
            input=request.input,
            idempotency_key=request.idempotency_key,
            attempt=request.attempt,
            deadline=received + ((request.wait_ms or 0) + request.budget_ms) / 1000,
            step_id=request.step_id,
            run_id=request.run_id,
            workflow=request.workflow,
            step=request.step,
            action=request.action,
            kind=request.kind,
            map_index=request.map_index,
            map_size=request.map_size,
            children=children,
        )
        return cls(delivery, request, call, received=received)


@dataclass(frozen=True)
class Outcome:
    job: Job
    reply: Reply | None
    """None: stay silent (the deadline passed)."""
    body: bytes = b""
    """The encoded reply, made in the worker thread so a bad value never reaches the owner."""

    @classmethod
    def of(cls, job: Job, reply: Reply | None, limits: Limits = DEFAULT_LIMITS) -> Outcome:
        if reply is None:
            return cls(job, None)
        try:
            return cls(job, reply, encode_within(reply, limits))
        except InvalidMessageError as exc:
            # Not serialisable, or beyond the limits the scheduler would dead-letter it for:
            # fail the step now with the reason instead of leaving it to its deadline.
            fallback = reply.model_copy(
                update={
                    "status": ReplyStatus.ERROR,
                    "output": None,
                    "defer_seconds": None,
                    "error": ErrorInfo(
                        type="InvalidOutputError",
                        message=safe_text(f"the reply could not be sent: {exc}"),
                    ),
                }
            )
            return cls(job, fallback, fallback.encode())


@dataclass
class AgentStats:
    received: int = 0
    replied_ok: int = 0
    replied_error: int = 0
    replied_failed: int = 0
    deferred: int = 0
    silent: int = 0
    dead_lettered: int = 0
    abandoned: int = 0
    started: int = 0
    """`step.started` messages sent (sasflow.agents.progress)."""
    heartbeats: int = 0
    acked_at_start: int = 0
    """Requests of long steps acknowledged once their start was confirmed (agents.acks)."""
    acked_at_take: int = 0
    """Exclusive requests acknowledged when a worker took them (agents.acks)."""
    handed_back: int = 0
    """Requests requeued unstarted for another process (agents.handback)."""
    cancelled: int = 0
    """Attempts stopped by a cancel, or not run because their cancel came first
    (agents.cancels)."""
    redelivered_dropped: int = 0
    """Redelivered exclusive requests not run: taken here already, or past their attempt's
    deadline counted from its claim (agents.redelivery)."""


REPLY_MARGIN = 0.1
"""Share of the remaining budget (at most REPLY_MARGIN_MAX seconds) in which no retry starts,
so that a step whose retries ran out can still reply `failed` before its deadline."""
REPLY_MARGIN_MAX = 1.0


def retry_budget(remaining: float) -> float:
    """Seconds in which retries may start: the budget less the margin kept for the reply."""
    return max(0.0, remaining - min(remaining * REPLY_MARGIN, REPLY_MARGIN_MAX))
