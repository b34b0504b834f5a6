"""SharedBreaker (a thread-safe circuit breaker that does not serialise calls) and retrying()."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pybreaker
import pytest

from sasflow.agents import BreakerOpenError
from sasflow.agents.resilience import SharedBreaker, retrying
from sasflow.policy import BreakerPolicy, RetryPolicy

RESET = 0.2


def _always(exc: BaseException) -> bool:
    del exc
    return True


def _only_connection_errors(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError)


def _raise_connection_error() -> None:
    raise ConnectionError("down")


def _breaker(fail_max: int = 3) -> SharedBreaker:
    return SharedBreaker("api", BreakerPolicy(fail_max=fail_max, reset_timeout=RESET))


def _fail(breaker: SharedBreaker, times: int) -> None:
    for _ in range(times):
        with pytest.raises(ConnectionError):
            breaker.call(_raise_connection_error, _always)


def _opened(fail_max: int = 2) -> SharedBreaker:
    breaker = _breaker(fail_max)
    _fail(breaker, fail_max)
    return breaker


# -- SharedBreaker ------------------------------------------------------------------------------


def test_closed_breaker_passes_results_and_exceptions_through() -> None:
    """While closed the function's result is returned and its exception re-raised unchanged."""
    breaker = _breaker()
    error = ConnectionError("exact")

    def fail() -> None:
        raise error

    assert breaker.call(lambda: 42, _always) == 42
    with pytest.raises(ConnectionError) as info:
        breaker.call(fail, _always)
    assert error is info.value
    assert breaker.state == pybreaker.STATE_CLOSED


def test_breaker_stays_closed_below_fail_max() -> None:
    """fail_max - 1 failures leave the breaker closed."""
    breaker = _breaker(fail_max=3)
    _fail(breaker, 2)

    assert breaker.state == pybreaker.STATE_CLOSED
    assert breaker.acquire() is False


def test_breaker_opens_after_fail_max_transient_failures() -> None:
    """fail_max consecutive transient failures open the breaker."""
    breaker = _breaker(fail_max=3)
    _fail(breaker, 3)

    assert breaker.state == pybreaker.STATE_OPEN


def test_open_breaker_fails_fast_without_calling() -> None:
    """While open, call() raises BreakerOpenError and does not run the function."""
    breaker = _opened()
    calls: list[int] = []

    with pytest.raises(BreakerOpenError) as info:
        breaker.call(lambda: calls.append(1), _always)

    assert calls == []
    assert info.value.dependency == "api"
    assert 0 < info.value.retry_after <= RESET


def test_open_breaker_retry_after_counts_down() -> None:
    """retry_after is the time left of reset_timeout, so it shrinks as time passes."""
    breaker = _opened()
    with pytest.raises(BreakerOpenError) as first:
        breaker.acquire()
    time.sleep(0.05)
    with pytest.raises(BreakerOpenError) as second:
        breaker.acquire()

    assert 0 < second.value.retry_after < first.value.retry_after <= RESET


def test_permanent_errors_do_not_count_as_failures() -> None:
    """Errors for which is_failure is False (the service answered) never open the breaker."""
    breaker = _breaker(fail_max=2)

    for _ in range(5):
        with pytest.raises(ValueError, match="bad input"):
            breaker.call(_raise_value_error, _only_connection_errors)

    assert breaker.state == pybreaker.STATE_CLOSED


def _raise_value_error() -> None:
    raise ValueError("bad input")


def test_success_or_permanent_error_resets_the_consecutive_count() -> None:
    """Failures must be consecutive: an answer in between starts the count again."""
    breaker = _breaker(fail_max=2)
    _fail(breaker, 1)
    with pytest.raises(ValueError, match="bad input"):
        breaker.call(_raise_value_error, _only_connection_errors)
    _fail(breaker, 1)
    breaker.call(lambda: None, _always)
    _fail(breaker, 1)

    assert breaker.state == pybreaker.STATE_CLOSED


def test_after_reset_timeout_exactly_one_trial_is_let_through() -> None:
    """Once reset_timeout passed, the first acquire is the trial; the others are deferred."""
    breaker = _opened()
    time.sleep(RESET + 0.05)

    assert breaker.acquire() is True
    for _ in range(3):
        with pytest.raises(BreakerOpenError) as info:
            breaker.acquire()
        assert 0 < info.value.retry_after <= RESET
    assert breaker.state == pybreaker.STATE_HALF_OPEN


def test_concurrent_callers_get_exactly_one_trial() -> None:
    """Threads racing for a half-open breaker: one runs the trial, the rest are deferred."""
    breaker = _opened()
    time.sleep(RESET + 0.05)
    release = threading.Event()
    ran: list[int] = []

    def trial() -> str:
        ran.append(1)
        release.wait(2)
        return "ok"

    def attempt() -> str:
        try:
            return breaker.call(trial, _always)
        except BreakerOpenError:
            return "deferred"

    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(attempt) for _ in range(6)]
        deadline = time.monotonic() + 2
        while sum(f.done() for f in futures) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        results = sorted(f.result() for f in futures)

    assert (results, ran) == (["deferred"] * 5 + ["ok"], [1])
    assert breaker.state == pybreaker.STATE_CLOSED


def test_trial_success_closes_the_breaker() -> None:
    """A successful trial call closes the breaker; calls then run normally."""
    breaker = _opened()
    time.sleep(RESET + 0.05)

    assert breaker.call(lambda: "trial", _always) == "trial"
    assert breaker.state == pybreaker.STATE_CLOSED
    assert breaker.acquire() is False


def test_trial_permanent_error_closes_the_breaker() -> None:
    """A trial answered with a permanent error proves the service is up: the breaker closes."""
    breaker = _opened()
    time.sleep(RESET + 0.05)

    with pytest.raises(ValueError, match="bad input"):
        breaker.call(_raise_value_error, _only_connection_errors)

    assert breaker.state == pybreaker.STATE_CLOSED


def test_trial_failure_reopens_the_breaker_for_a_full_reset_timeout() -> None:
    """A failed trial opens the breaker again, counting reset_timeout from the trial."""
    breaker = _opened()
    time.sleep(RESET + 0.05)

    _fail(breaker, 1)

    assert breaker.state == pybreaker.STATE_OPEN
    with pytest.raises(BreakerOpenError) as info:
        breaker.acquire()
    assert RESET - 0.1 < info.value.retry_after <= RESET


def test_after_a_failed_trial_a_new_trial_follows_the_next_timeout() -> None:
    """The trial slot is released after a failed trial, so a later trial can close it."""
    breaker = _opened()
    time.sleep(RESET + 0.05)
    _fail(breaker, 1)
    time.sleep(RESET + 0.05)

    assert breaker.call(lambda: "ok", _always) == "ok"
    assert breaker.state == pybreaker.STATE_CLOSED


def test_outcomes_of_calls_started_before_the_trip_do_not_decide_the_trial() -> None:
    """While half-open only the trial's outcome counts: late outcomes of older calls do not."""
    breaker = _opened()
    time.sleep(RESET + 0.05)
    assert breaker.acquire() is True

    breaker.record(trial=False, failure=ConnectionError("late failure"))
    assert breaker.state == pybreaker.STATE_HALF_OPEN
    breaker.record(trial=False, failure=None)
    assert breaker.state == pybreaker.STATE_HALF_OPEN

    breaker.record(trial=True, failure=None)
    assert breaker.state == pybreaker.STATE_CLOSED


def test_breaker_open_error_message_names_dependency_and_delay() -> None:
    """The error says which dependency is open and when to retry."""
    error = BreakerOpenError("api", 2.345)

    assert str(error) == "circuit breaker for 'api' is open; retry in 2.3s"


def _max_overlap(
    call: Callable[[Callable[[], None]], None], threads: int, seconds: float
) -> tuple[int, float]:
    """Run `threads` concurrent calls of a slow function; the peak overlap and wall time."""
    lock = threading.Lock()
    running = [0, 0]  # current, peak

    def slow() -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        time.sleep(seconds)
        with lock:
            running[0] -= 1

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(call, slow) for _ in range(threads)]:
            future.result()
    return running[1], time.monotonic() - start


def test_concurrent_calls_through_a_closed_breaker_overlap() -> None:
    """8 threads calling a 0.3 s function run together: the breaker does not serialise them."""
    breaker = _breaker()

    peak, elapsed = _max_overlap(lambda f: breaker.call(f, _always), threads=8, seconds=0.3)

    assert peak == 8
    assert elapsed < 8 * 0.3 / 2


def test_pybreaker_call_would_serialise_the_same_calls() -> None:
    """Control for the test above: pybreaker's own call() holds its lock during the call."""
    plain = pybreaker.CircuitBreaker(fail_max=3, reset_timeout=RESET)

    peak, elapsed = _max_overlap(plain.call, threads=4, seconds=0.1)

    assert peak == 1
    assert elapsed >= 4 * 0.1


# -- retrying() ---------------------------------------------------------------------------------

FAST = RetryPolicy(initial=0.01, maximum=0.02)


def _flaky(failures: int, attempts: list[float]) -> Callable[[], str]:
    def function() -> str:
        attempts.append(time.monotonic())
        if len(attempts) <= failures:
            raise ConnectionError("flaky")
        return "done"

    return function


def test_transient_errors_are_retried_until_success() -> None:
    """A function that fails transiently twice succeeds on the third attempt."""
    attempts: list[float] = []
    retry = retrying(
        FAST, budget=5, is_transient=_only_connection_errors, interrupted=threading.Event()
    )

    assert retry(_flaky(2, attempts)) == "done"
    assert len(attempts) == 3


def test_permanent_error_is_not_retried() -> None:
    """An error is_transient rejects is raised after the first attempt."""
    attempts: list[int] = []

    def permanent() -> None:
        attempts.append(1)
        raise ValueError("no")

    retry = retrying(
        FAST, budget=5, is_transient=_only_connection_errors, interrupted=threading.Event()
    )

    with pytest.raises(ValueError, match="no"):
        retry(permanent)
    assert attempts == [1]


def test_retries_never_sleep_past_the_budget() -> None:
    """Always-failing transient calls stop within the budget, re-raising the last error."""
    attempts: list[float] = []
    budget = 0.5
    retry = retrying(
        RetryPolicy(initial=0.1, maximum=0.3),
        budget=budget,
        is_transient=_only_connection_errors,
        interrupted=threading.Event(),
    )

    start = time.monotonic()
    with pytest.raises(ConnectionError, match="flaky"):
        retry(_flaky(10**6, attempts))
    elapsed = time.monotonic() - start

    assert len(attempts) > 1
    assert elapsed < budget + 0.05


def test_max_attempts_limits_the_retries() -> None:
    """With max_attempts the function runs at most that many times."""
    attempts: list[float] = []
    retry = retrying(
        RetryPolicy(initial=0.01, maximum=0.01, max_attempts=3),
        budget=5,
        is_transient=_only_connection_errors,
        interrupted=threading.Event(),
    )

    with pytest.raises(ConnectionError):
        retry(_flaky(10, attempts))
    assert len(attempts) == 3


def test_set_interrupted_event_stops_retrying() -> None:
    """Once the interrupted event is set no further attempt is made."""
    interrupted = threading.Event()
    attempts: list[int] = []

    def fails_and_interrupts() -> None:
        attempts.append(1)
        interrupted.set()
        raise ConnectionError("down")

    retry = retrying(FAST, budget=5, is_transient=_only_connection_errors, interrupted=interrupted)

    with pytest.raises(ConnectionError):
        retry(fails_and_interrupts)
    assert attempts == [1]


def _longest_wait(low: float, high: float) -> float:
    del low
    return high


def test_no_attempt_runs_after_an_interrupted_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Setting the event during a 1 s backoff sleep ends retrying at once, and the function is
    not called again."""
    monkeypatch.setattr(random, "uniform", _longest_wait)
    interrupted = threading.Event()
    attempts: list[float] = []
    timer = threading.Timer(0.1, interrupted.set)
    retry = retrying(
        RetryPolicy(initial=1.0, maximum=1.0),
        budget=5,
        is_transient=_only_connection_errors,
        interrupted=interrupted,
    )

    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(ConnectionError):
            retry(_flaky(10, attempts))
    finally:
        timer.cancel()

    assert time.monotonic() - start < 0.5
    assert len(attempts) == 1
