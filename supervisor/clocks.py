"""Which of a step's clocks ran out, and who is charged for it (docs/timeouts.md).

- The **wait clock** (`wait_timeout`): a dispatched request no agent took. Not the remote
  service's fault: the step goes back to `pending` with no failure counted (`WaitTimeout`).
- The **execution clock** (`timeout`): an agent started the attempt and did not reply in time.
  One failure counted (`ExecutionTimeout`).
- The **heartbeat clock** (`heartbeat_timeout`): an agent started the attempt and then fell
  silent for longer than the step's heartbeat timeout (the agent died, or its handler hangs).
  One failure counted (`HeartbeatTimeout`).

Rows written before the clocks existed say `Timeout` (an expiry of the one old deadline).
Plain Python: the sweep hands it the rows it read, and stores what it answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from sasflow.commands import StoredError

WAIT_TIMEOUT = "WaitTimeout"
EXECUTION_TIMEOUT = "ExecutionTimeout"
HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
LEGACY_TIMEOUT = "Timeout"
"""The error type of expiries recorded before the three clocks (one deadline for all)."""

CHARGED_REASON = "expired"
"""The event reason of a clock expiry that counts a failure (execution, heartbeat)."""
WAIT_REASON = "wait expired"
"""The event reason of a wait-clock expiry (no failure counted)."""

_TOLERANCE = timedelta(milliseconds=1)
"""Rounding between the database's interval arithmetic and Python's."""


@dataclass(frozen=True)
class Expiry:
    """What the sweep records for one expired attempt."""

    charged: bool
    """True: one failure counted; False: back to pending, uncharged."""
    error: StoredError

    @property
    def reason(self) -> str:
        return CHARGED_REASON if self.charged else WAIT_REASON


class ExpiredStep(Protocol):
    """What deciding needs of an expired `processing` step."""

    @property
    def started_at(self) -> datetime | None: ...
    @property
    def complete_by(self) -> datetime: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def wait_timeout_s(self) -> float: ...
    @property
    def heartbeat_timeout_s(self) -> float | None: ...


def seconds(value: float) -> str:
    """`value` as the messages show a duration: `30 s`, `0.5 s`."""
    return f"{value:g} s"


def expired(step: ExpiredStep) -> Expiry:
    """The clock that ran out for `step`, whose `complete_by` passed.

    Not started (no agent said `started`): its `complete_by` was the whole envelope, wait then
    execution. The wait clock is charged to nobody: the request may have been lost, or nobody
    took it while its dead letter went astray. (An agent older than the clocks never says
    `started`: its steps end here too when it overruns; docs/timeouts.md.) Started: the
    heartbeat clock when the step has one and its heartbeat deadline came before the
    execution deadline, else the execution clock."""
    if step.started_at is None:
        envelope = step.wait_timeout_s + step.timeout_s
        return Expiry(
            charged=False,
            error=StoredError(
                WAIT_TIMEOUT,
                f"wait clock: no agent started the request within {seconds(envelope)} "
                f"(wait timeout {seconds(step.wait_timeout_s)} + timeout "
                f"{seconds(step.timeout_s)}), and no reply came",
            ),
        )
    execution_deadline = step.started_at + timedelta(seconds=step.timeout_s)
    heartbeat = step.heartbeat_timeout_s
    if heartbeat is not None and step.complete_by < execution_deadline - _TOLERANCE:
        return Expiry(
            charged=True,
            error=StoredError(
                HEARTBEAT_TIMEOUT, f"heartbeat clock: no heartbeat for {seconds(heartbeat)}"
            ),
        )
    return Expiry(
        charged=True,
        error=StoredError(
            EXECUTION_TIMEOUT,
            f"execution clock: no reply within the step's timeout of {seconds(step.timeout_s)} "
            "after the agent started it",
        ),
    )


def not_taken(wait_ms: int | None, how: str) -> Expiry:
    """A request the broker dead-lettered before any agent took it (`how`: the broker's
    x-death reason, `expired` or `maxlen`): the wait clock, uncharged."""
    if how == "expired" and wait_ms is not None:
        message = f"wait clock: no agent took the request within {seconds(wait_ms / 1000)}"
    elif how == "expired":
        message = "wait clock: no agent took the request within its wait timeout"
    else:
        message = f"wait clock: the broker dropped the request before an agent took it ({how})"
    return Expiry(charged=False, error=StoredError(WAIT_TIMEOUT, message))
