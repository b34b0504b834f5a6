"""Turn retry and breaker policies into tenacity and pybreaker objects (the only place that does).

Breakers: one per remote dependency per agent process, shared by all worker threads, so the
threads together trip it and together stop hammering a dead service. pybreaker's own `call()`
holds the breaker's lock for the whole remote call, which would serialise every worker thread
behind one slow call; here the remote call runs outside any lock and only the bookkeeping goes
through pybreaker (microseconds under the lock). In half-open state exactly one trial call is let
through; other threads are deferred until it settles.

Across the fleet (best effort): a breaker that opens on its own failures, or closes after a
successful trial call, tells `on_change`; the worker announces it to the agent's other
instances, which `apply_remote` it: a closed breaker opens for what is left of the announcer's
reset timeout; an announced close closes an open or half-open one. Changes applied from an
announcement are not announced again. Half-open trials stay per instance.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pybreaker
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    stop_when_event_set,
    wait_random_exponential,
)

from sasflow.agents.errors import BreakerOpenError
from sasflow.policy import BreakerPolicy, RetryPolicy

T = TypeVar("T")

HALF_OPEN_DEFER = 1.0
"""Seconds a step is deferred while another thread's trial call decides a half-open breaker."""


BreakerChange = Callable[[str, str, float], None]
"""`on_change(dependency, state, open_for)`: a breaker opened ("open", seconds until its trial)
or closed after a successful trial ("closed", 0.0) on its own; called under the breaker's lock,
so it must only hand the change over (the worker queues it for its owner thread)."""


class _OpenedAt(pybreaker.CircuitBreakerListener):
    def __init__(self, on_change: Callable[[str, str], None]) -> None:
        self.at = 0.0
        self._on_change = on_change

    def state_change(  # signature fixed by pybreaker
        self,
        cb: pybreaker.CircuitBreaker,  # noqa: ARG002
        old_state: pybreaker.CircuitBreakerState | None,
        new_state: pybreaker.CircuitBreakerState,
    ) -> None:
        if new_state.name == pybreaker.STATE_OPEN:
            self.at = time.monotonic()
        self._on_change(old_state.name if old_state is not None else "", new_state.name)


def _sleep(interrupted: threading.Event, seconds: float) -> None:
    interrupted.wait(seconds)


def _noop() -> None:
    return None


def _fail(exc: BaseException) -> None:
    raise exc


class SharedBreaker:
    """A thread-safe circuit breaker around one remote dependency."""

    def __init__(
        self,
        dependency: str,
        policy: BreakerPolicy,
        *,
        on_change: BreakerChange | None = None,
        observe: Callable[[str, str], None] | None = None,
    ) -> None:
        """`on_change` hears the changes to announce to the fleet (its own opens and trial
        closes); `observe(dependency, state)` hears every state change, a peer's included (for
        metrics). Both are called under the breaker's lock: they must be quick."""
        self.dependency = dependency
        self.policy = policy
        self._announce = on_change
        self._observe = observe
        self._remote = False  # applying a peer's announcement: do not announce it back
        self._opened = _OpenedAt(self._changed)
        self._cb = pybreaker.CircuitBreaker(
            fail_max=policy.fail_max,
            reset_timeout=policy.reset_timeout,
            name=dependency,
            listeners=[self._opened],
            throw_new_error_on_trip=False,
        )
        self._lock = threading.Lock()
        self._trial = False
        self._trial_started = 0.0

    @property
    def state(self) -> str:
        return str(self._cb.current_state)

    def _changed(self, old: str, new: str) -> None:
        if self._observe is not None:
            self._observe(self.dependency, new)
        if self._announce is None or self._remote:
            return
        if new == pybreaker.STATE_OPEN:
            self._announce(self.dependency, "open", self.policy.reset_timeout)
        elif new == pybreaker.STATE_CLOSED and old == pybreaker.STATE_HALF_OPEN:
            self._announce(self.dependency, "closed", 0.0)

    def apply_remote(self, state: str, open_for: float) -> bool:
        """Apply a peer instance's announcement; True when it changed this breaker. An open
        announced to a closed breaker opens it for `open_for` seconds (then a trial call goes
        through, as after its own reset timeout); a close closes an open or half-open one."""
        with self._lock:
            current = self._cb.current_state
            self._remote = True
            try:
                if state == "open" and current == pybreaker.STATE_CLOSED:
                    self._cb.open()
                    wait = min(max(0.0, open_for), self.policy.reset_timeout)
                    self._opened.at = time.monotonic() + wait - self.policy.reset_timeout
                    return True
                if state == "closed" and current != pybreaker.STATE_CLOSED:
                    self._cb.close()
                    self._trial = False
                    return True
            finally:
                self._remote = False
            return False

    def open_for(self) -> float | None:
        """Seconds until the open breaker lets a trial through; None when it is not open."""
        with self._lock:
            if self._cb.current_state != pybreaker.STATE_OPEN:
                return None
            return max(0.0, self._opened.at + self.policy.reset_timeout - time.monotonic())

    def acquire(self) -> bool:
        """Allow a call or raise BreakerOpenError; True when the call is the half-open trial."""
        with self._lock:
            state = self._cb.current_state
            if state == pybreaker.STATE_CLOSED:
                return False
            if state == pybreaker.STATE_OPEN:
                wait = self._opened.at + self.policy.reset_timeout - time.monotonic()
                if wait > 0:
                    raise BreakerOpenError(self.dependency, wait)
                self._cb.half_open()
            # A trial that outlived reset_timeout is presumed hung: let another one through.
            trial_age = time.monotonic() - self._trial_started
            if self._trial and trial_age < self.policy.reset_timeout:
                raise BreakerOpenError(
                    self.dependency, min(HALF_OPEN_DEFER, self.policy.reset_timeout)
                )
            self._trial = True
            self._trial_started = time.monotonic()
            return True

    def record(self, *, trial: bool, failure: BaseException | None) -> None:
        """Count the outcome of a call that `acquire` allowed."""
        with self._lock:
            if trial:
                self._trial = False
            elif self._cb.current_state != pybreaker.STATE_CLOSED:
                return  # a call from before the trip: the trial alone decides now
            # The callables are trivial, so pybreaker's lock is held only for its bookkeeping.
            with contextlib.suppress(BaseException):
                if failure is None:
                    self._cb.call(_noop)
                else:
                    self._cb.call(_fail, failure)

    def call(self, function: Callable[[], T], is_failure: Callable[[BaseException], bool]) -> T:
        """Run `function` through the breaker; exceptions for which `is_failure` is False
        (permanent errors: the service answered) count as successes."""
        trial = self.acquire()
        try:
            result = function()
        except BaseException as exc:
            self.record(trial=trial, failure=exc if is_failure(exc) else None)
            raise
        self.record(trial=trial, failure=None)
        return result


def retrying(
    policy: RetryPolicy,
    *,
    budget: float,
    is_transient: Callable[[BaseException], bool],
    interrupted: threading.Event,
    on_retry: Callable[[BaseException, int], None] | None = None,
    retry_after: Callable[[BaseException], float | None] | None = None,
) -> Retrying:
    """Exponential backoff with full jitter on transient errors, never sleeping past `budget`
    seconds from now; a set `interrupted` event (shutdown, deadline) cuts the sleep short.
    `retry_after(error)`: seconds the remote service asked to wait (a `Retry-After`), the
    least sleep before the next try; when it does not fit in the budget, the retries stop."""
    stop: Any = stop_before_delay(budget) | stop_when_event_set(interrupted)
    if policy.max_attempts is not None:
        stop = stop | stop_after_attempt(policy.max_attempts)
    last_failure: list[BaseException] = []

    def remember(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if error is not None:
            last_failure[:] = [error]

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if on_retry is not None and error is not None:
            on_retry(error, state.attempt_number)

    def not_after_interruption(state: RetryCallState) -> None:
        # tenacity checks `stop` before sleeping only; an interrupted sleep must not be
        # followed by one more call: re-raise the last attempt's error instead.
        if state.attempt_number > 1 and interrupted.is_set() and last_failure:
            raise last_failure[0]

    backoff = wait_random_exponential(multiplier=policy.initial, max=policy.maximum)

    def wait(state: RetryCallState) -> float:
        delay = backoff(state)
        error = state.outcome.exception() if state.outcome is not None else None
        asked = retry_after(error) if retry_after is not None and error is not None else None
        return delay if asked is None else max(delay, asked)

    return Retrying(
        before=not_after_interruption,
        after=remember,
        before_sleep=before_sleep,
        stop=stop,
        wait=wait,
        retry=retry_if_exception(is_transient),
        sleep=lambda seconds: _sleep(interrupted, seconds),
        reraise=True,
    )
