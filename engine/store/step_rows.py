"""The one builder of step records: forward steps at submission, compensation steps when a run
compensates. Both get a fresh idempotency key and start `pending`, or `waiting` when they
depend on other steps."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sasflow.policy import StepPolicy
from sasflow.states import StepKind, StepState

POLICY_COLUMNS = (
    "timeout_s",
    "max_failures",
    "backoff_initial_s",
    "backoff_multiplier",
    "backoff_max_s",
    "give_up_s",
)
"""The step's policy as stored with it (a run keeps the policy of its definition version)."""


def policy_columns(policy: StepPolicy) -> dict[str, Any]:
    """A definition's step policy as the columns of its step record."""
    return {
        "timeout_s": policy.timeout,
        "max_failures": policy.max_failures,
        "backoff_initial_s": policy.backoff.initial,
        "backoff_multiplier": policy.backoff.multiplier,
        "backoff_max_s": policy.backoff.maximum,
        "give_up_s": policy.give_up_after,
    }


def step_row(
    *,
    run_id: int,
    name: str,
    kind: StepKind,
    agent: str,
    action: str,
    depends_on: Sequence[str],
    priority: int,
    input: Any,  # noqa: A002 - the column's name
    policy: dict[str, Any],
    compensate_action: str | None = None,
    pool: str | None = None,
) -> dict[str, Any]:
    """The values of one new step record (`policy`: the POLICY_COLUMNS)."""
    return {
        "run_id": run_id,
        "name": name,
        "kind": kind,
        "agent": agent,
        "action": action,
        "compensate_action": compensate_action,
        "depends_on": list(depends_on),
        "state": StepState.WAITING if depends_on else StepState.PENDING,
        "priority": priority,
        "idempotency_key": uuid.uuid4().hex,
        "input": input,
        "pool": pool,
        **policy,
    }
