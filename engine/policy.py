"""Frozen policy dataclasses: how long a step may take, how often it may fail, how to back off.

Step policies are copied into each step row at submission, so a running step keeps the policy it
started with. Retry and breaker policies are turned into tenacity and pybreaker objects in
`sasflow.agents.resilience`, and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from sasflow.errors import DefinitionError
from sasflow.states import OnExhausted

ExhaustedPolicy = Literal["fail", "park"]
"""What `on_exhausted` and `on_error` accept besides an OnExhausted."""

MAX_MULTIPLIER = 10.0
"""Keeps initial * multiplier ** 64 finite in SQL (the sweep computes backoff in the database)."""


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise DefinitionError(f"{name} must be > 0, got {value!r}")


def _not_below(name: str, value: float, low_name: str, low: float) -> None:
    if not (math.isfinite(value) and value >= low):
        raise DefinitionError(f"{name} ({value}) must be >= {low_name} ({low})")


@dataclass(frozen=True)
class Backoff:
    """Exponential, capped delay before a failed step is tried again: initial * multiplier**n."""

    initial: float = 1.0
    multiplier: float = 2.0
    maximum: float = 300.0

    def __post_init__(self) -> None:
        _positive("backoff.initial", self.initial)
        if not (math.isfinite(self.multiplier) and 1 <= self.multiplier <= MAX_MULTIPLIER):
            raise DefinitionError(
                f"backoff.multiplier must be >= 1 and <= {MAX_MULTIPLIER}, got {self.multiplier!r}"
            )
        _not_below("backoff.maximum", self.maximum, "backoff.initial", self.initial)

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failure (1-based)."""
        exponent = min(max(failures - 1, 0), 64)  # the same cap as the SQL of the sweep
        return min(self.maximum, self.initial * self.multiplier**exponent)


@dataclass(frozen=True)
class StepPolicy:
    """The scheduler's and supervisor's rules for one step: its three clocks (docs/timeouts.md),
    how often it may fail and how it backs off."""

    timeout: float = 30.0
    """The execution clock: seconds an agent has for one attempt, from the moment it starts
    it (time waiting in the agent's queue is not deducted). Exceeding it counts a failure."""
    max_failures: int = 3
    """Failures (execution or heartbeat timeouts, give-ups) after which the step goes to
    `error`."""
    backoff: Backoff = field(default_factory=Backoff)
    give_up_after: float = 86400.0
    """Seconds a step may stay deferred by open circuit breakers before that counts as failing."""
    wait_timeout: float = 30.0
    """The wait clock: seconds a dispatched request may wait for an agent to take it. Past it
    the request is dropped and the step is pending again, no failure counted."""
    heartbeat_timeout: float | None = None
    """The heartbeat clock: when set, a started attempt must heartbeat (`Call.heartbeat()`) at
    least this often, or it counts a failure; at most `timeout`. None: no heartbeat needed."""
    on_exhausted: OnExhausted | ExhaustedPolicy | None = None
    """When its failures run out: `fail` (the run follows its failure policy) or `park` (the
    step waits `parked` for an operator, docs/operations.md). None: the workflow's."""
    on_error: OnExhausted | ExhaustedPolicy | None = None
    """When its agent answers a permanent `error`: `fail` or `park`. None: what the workflow's
    `on_error` says, else what this step does when its failures run out."""

    def __post_init__(self) -> None:
        for name in ("on_exhausted", "on_error"):
            object.__setattr__(self, name, exhausted_policy(name, getattr(self, name)))
        _positive("timeout", self.timeout)
        _positive("give_up_after", self.give_up_after)
        _positive("wait_timeout", self.wait_timeout)
        if self.heartbeat_timeout is not None:
            _positive("heartbeat_timeout", self.heartbeat_timeout)
            if self.heartbeat_timeout > self.timeout:
                raise DefinitionError(
                    f"heartbeat_timeout ({self.heartbeat_timeout}) must be <= timeout "
                    f"({self.timeout}): the timeout caps an attempt however it heartbeats"
                )
        if self.max_failures < 1:
            raise DefinitionError(f"max_failures must be >= 1, got {self.max_failures!r}")


def exhausted_policy(name: str, value: object) -> OnExhausted | None:
    """`value` as an OnExhausted ('fail' or 'park'), or None; DefinitionError otherwise."""
    if value is None:
        return None
    if value not in set(OnExhausted):
        raise DefinitionError(f"{name} must be 'fail' or 'park', got {value!r}")
    return OnExhausted(str(value))


@dataclass(frozen=True)
class RetryPolicy:
    """How an agent retries transient errors inside one attempt (never past the deadline)."""

    initial: float = 0.1
    maximum: float = 5.0
    max_attempts: int | None = None
    """None: retry until the deadline."""

    def __post_init__(self) -> None:
        _positive("retry.initial", self.initial)
        _not_below("retry.maximum", self.maximum, "retry.initial", self.initial)
        if self.max_attempts is not None and self.max_attempts < 1:
            raise DefinitionError(f"retry.max_attempts must be >= 1, got {self.max_attempts!r}")


@dataclass(frozen=True)
class BreakerPolicy:
    """A circuit breaker around one remote dependency of an agent."""

    fail_max: int = 5
    """Consecutive transient failures that open the breaker."""
    reset_timeout: float = 30.0
    """Seconds the breaker stays open before one trial call is let through."""

    def __post_init__(self) -> None:
        _positive("reset_timeout", self.reset_timeout)
        if self.fail_max < 1:
            raise DefinitionError(f"fail_max must be >= 1, got {self.fail_max!r}")
