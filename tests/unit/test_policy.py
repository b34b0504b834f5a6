"""Policy dataclasses: backoff arithmetic, validation of every field, immutability."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from sasflow.errors import DefinitionError
from sasflow.policy import Backoff, BreakerPolicy, RetryPolicy, StepPolicy


def test_backoff_first_delay_is_initial() -> None:
    """After the first failure the delay is `initial`."""
    assert Backoff(initial=1.5, multiplier=3, maximum=100).delay(1) == 1.5


def test_backoff_grows_exponentially() -> None:
    """Each further failure multiplies the delay by `multiplier`."""
    backoff = Backoff(initial=1.5, multiplier=3, maximum=1000)

    assert [backoff.delay(n) for n in (1, 2, 3, 4)] == [1.5, 4.5, 13.5, 40.5]


def test_backoff_is_capped_at_maximum() -> None:
    """The delay never exceeds `maximum`."""
    backoff = Backoff(initial=1, multiplier=2, maximum=10)

    assert [backoff.delay(n) for n in (4, 5, 6)] == [8.0, 10.0, 10.0]


def test_backoff_zero_or_negative_failures_give_initial() -> None:
    """Counts below 1 are treated as the first failure."""
    backoff = Backoff(initial=2, multiplier=2, maximum=10)

    assert [backoff.delay(0), backoff.delay(-3)] == [2.0, 2.0]


@pytest.mark.parametrize("failures", [1_000, 10**9, 10**18])
def test_backoff_huge_failure_counts_do_not_overflow(failures: int) -> None:
    """A huge failure count gives the maximum instead of an OverflowError."""
    assert Backoff().delay(failures) == 300.0


def test_backoff_large_multiplier_is_rejected_and_the_largest_allowed_does_not_overflow() -> None:
    """Multipliers above 10 are rejected (the sweep computes backoff in SQL doubles); the
    largest allowed one is capped at the maximum, not an OverflowError."""
    with pytest.raises(DefinitionError, match="multiplier must be >= 1 and <= 10"):
        Backoff(initial=1, multiplier=1e6, maximum=60)
    assert Backoff(initial=1, multiplier=10, maximum=60).delay(100) == 60.0


def test_backoff_multiplier_one_is_constant() -> None:
    """multiplier=1 gives a constant delay."""
    backoff = Backoff(initial=5, multiplier=1, maximum=5)

    assert [backoff.delay(n) for n in (1, 2, 50)] == [5.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial": 0}, r"backoff.initial must be > 0, got 0"),
        ({"initial": -1}, r"backoff.initial must be > 0, got -1"),
        ({"initial": math.nan}, r"backoff.initial must be > 0, got nan"),
        ({"multiplier": 0.5}, r"backoff.multiplier must be >= 1 and <= 10.0, got 0.5"),
        ({"initial": 10, "maximum": 5}, r"backoff.maximum \(5\) must be >= backoff.initial \(10\)"),
    ],
)
def test_backoff_rejects_invalid_fields(kwargs: dict[str, Any], message: str) -> None:
    """Every invalid Backoff field is a DefinitionError naming the field and value."""
    with pytest.raises(DefinitionError, match=message):
        Backoff(**kwargs)


@pytest.mark.parametrize("field", ["multiplier", "maximum"])
def test_backoff_rejects_nan(field: str) -> None:
    """NaN is not a valid multiplier or maximum."""
    with pytest.raises(DefinitionError, match=field):
        Backoff(**{field: math.nan})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, r"timeout must be > 0, got 0"),
        ({"timeout": -5.0}, r"timeout must be > 0, got -5.0"),
        ({"give_up_after": 0}, r"give_up_after must be > 0, got 0"),
        ({"max_failures": 0}, r"max_failures must be >= 1, got 0"),
        ({"max_failures": -2}, r"max_failures must be >= 1, got -2"),
    ],
)
def test_step_policy_rejects_invalid_fields(kwargs: dict[str, Any], message: str) -> None:
    """Every invalid StepPolicy field is a DefinitionError naming the field and value."""
    with pytest.raises(DefinitionError, match=message):
        StepPolicy(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial": 0}, r"retry.initial must be > 0, got 0"),
        ({"initial": 2, "maximum": 1}, r"retry.maximum \(1\) must be >= retry.initial \(2\)"),
        ({"max_attempts": 0}, r"retry.max_attempts must be >= 1, got 0"),
    ],
)
def test_retry_policy_rejects_invalid_fields(kwargs: dict[str, Any], message: str) -> None:
    """Every invalid RetryPolicy field is a DefinitionError naming the field and value."""
    with pytest.raises(DefinitionError, match=message):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fail_max": 0}, r"fail_max must be >= 1, got 0"),
        ({"reset_timeout": 0}, r"reset_timeout must be > 0, got 0"),
        ({"reset_timeout": -1.0}, r"reset_timeout must be > 0, got -1.0"),
    ],
)
def test_breaker_policy_rejects_invalid_fields(kwargs: dict[str, Any], message: str) -> None:
    """Every invalid BreakerPolicy field is a DefinitionError naming the field and value."""
    with pytest.raises(DefinitionError, match=message):
        BreakerPolicy(**kwargs)


def test_defaults_are_valid_and_documented_values() -> None:
    """The defaults are the values the docs promise."""
    assert StepPolicy(30.0, 3, Backoff(1.0, 2.0, 300.0), 86400.0) == StepPolicy()
    assert RetryPolicy(0.1, 5.0, None) == RetryPolicy()
    assert BreakerPolicy(5, 30.0) == BreakerPolicy()


def test_valid_edge_values_are_accepted() -> None:
    """The smallest allowed values construct."""
    assert StepPolicy(max_failures=1).max_failures == 1
    assert RetryPolicy(max_attempts=1).max_attempts == 1
    assert BreakerPolicy(fail_max=1).fail_max == 1
    assert Backoff(initial=2, maximum=2).maximum == 2.0


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (Backoff(), "initial"),
        (StepPolicy(), "timeout"),
        (RetryPolicy(), "max_attempts"),
        (BreakerPolicy(), "fail_max"),
    ],
)
def test_policies_are_frozen(policy: object, field: str) -> None:
    """Policies cannot be changed after construction."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(policy, field, 99)


def test_replace_revalidates() -> None:
    """dataclasses.replace builds a new policy, validated like any other."""
    with pytest.raises(DefinitionError, match="fail_max"):
        dataclasses.replace(BreakerPolicy(), fail_max=0)


def test_policies_compare_by_value() -> None:
    """Equal fields make equal policies (they are stored with each step)."""
    assert StepPolicy(timeout=5, backoff=Backoff(2)) == StepPolicy(timeout=5, backoff=Backoff(2))
    assert StepPolicy(timeout=5) != StepPolicy(timeout=6)


def test_retry_policy_rejects_nan_maximum() -> None:
    """NaN is not a valid retry maximum."""
    with pytest.raises(DefinitionError, match=r"retry\.maximum"):
        RetryPolicy(maximum=math.nan)
