"""Retention policies: the settings' two rules, zero keeps forever, only finished states."""

from __future__ import annotations

import pytest

from sasflow.errors import InvalidActionError
from sasflow.ops.retention import DAY, FAILED_RUN_STATES, RetentionPolicy
from sasflow.settings import Settings
from sasflow.states import RunState
from sasflow.store.operator.retention import RetentionRule


def test_settings_give_completed_and_failed_rules_in_days() -> None:
    policy = RetentionPolicy.from_settings(Settings(retain_completed_days=2, retain_failed_days=5))
    assert policy.rules == (
        RetentionRule((RunState.COMPLETED,), 2 * DAY),
        RetentionRule(tuple(sorted(FAILED_RUN_STATES)), 5 * DAY),
    )
    assert set(FAILED_RUN_STATES) == {
        RunState.ERROR,
        RunState.COMPENSATION_FAILED,
        RunState.CANCELLED,
        RunState.COMPENSATED,
    }


def test_zero_days_keeps_those_runs_forever() -> None:
    assert RetentionPolicy.of(completed_days=0, failed_days=0).rules == ()
    (rule,) = RetentionPolicy.of(completed_days=0, failed_days=1).rules
    assert RunState.COMPLETED not in rule.states


@pytest.mark.parametrize("state", [RunState.PENDING, RunState.RUNNING, RunState.COMPENSATING])
def test_an_active_state_is_refused(state: RunState) -> None:
    with pytest.raises(InvalidActionError, match="only finished runs"):
        RetentionPolicy.older_than(60, [state])


def test_a_state_with_two_rules_or_a_negative_age_is_refused() -> None:
    with pytest.raises(InvalidActionError, match="two retention rules"):
        RetentionPolicy((RetentionRule((RunState.ERROR,), 1), RetentionRule((RunState.ERROR,), 2)))
    with pytest.raises(InvalidActionError, match="negative"):
        RetentionPolicy.older_than(-1)
