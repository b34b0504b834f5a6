"""Exceptions a handler raises to say how its failure should be treated."""

from __future__ import annotations

import math

from sasflow.errors import SasflowError


class TransientError(SasflowError):
    """A failure worth retrying (the remote service may succeed next time)."""


class PermanentError(SasflowError):
    """A failure that retrying cannot fix; the step goes to error with this reason."""


class BreakerOpenError(SasflowError):
    """The remote dependency's circuit breaker is open: the step is deferred, not failed."""

    def __init__(self, dependency: str, retry_after: float) -> None:
        super().__init__(f"circuit breaker for {dependency!r} is open; retry in {retry_after:.1f}s")
        self.dependency = dependency
        self.retry_after = retry_after


class ChildKilledError(TransientError):
    """A program run by the handler was killed: the deadline passed, the agent stopped, or the
    step was cancelled (agents.cancels).

    Transient: the step is handed back (or left to its deadline), never failed for good."""


class Defer(Exception):  # noqa: N818 - a request of the handler, not an error
    """Raised by a handler to say "not yet, ask me again in `seconds`": the step goes back to
    pending for that long without counting a failure (a `deferred` reply). The step's give-up
    age bounds how long it may keep deferring (docs/agents.md)."""

    def __init__(self, seconds: float, reason: str = "deferred by the handler") -> None:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"Defer: seconds must be a finite number >= 0, got {seconds!r}")
        super().__init__(reason)
        self.seconds = float(seconds)
        self.reason = reason
