"""Exceptions a handler raises to say how its failure should be treated."""

from __future__ import annotations

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
    """A program run by the handler was killed: the step's deadline passed or the agent stopped.

    Transient: the step is handed back (or left to its deadline), never failed for good."""
