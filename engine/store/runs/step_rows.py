"""The one description of a step record as it is created: its columns (`STEP_COLUMNS`), the
builder of its values (`step_row`: forward steps at submission, compensation steps when a run
compensates), and the birth of its idempotency key. The one-statement submission
(store.submit_many) derives its step template and its SQL text from the same columns.

A new step record gets a fresh idempotency key and starts `pending`, or `waiting` when it
depends on other steps.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sasflow.policy import StepPolicy
from sasflow.states import StepKind, StepState
from sasflow.workflow import Workflow


@dataclass(frozen=True)
class StepColumn:
    """A column written when a step record is created."""

    name: str
    defined: str | None = None
    """Its PostgreSQL type when the step's definition gives its value (the same for every run
    of a workflow version: the one-statement submission's template carries it); None when the
    run gives it (its id, priority and input) or it is drawn for each record (the key)."""


POLICY_COLUMNS = (
    "timeout_s",
    "max_failures",
    "backoff_initial_s",
    "backoff_multiplier",
    "backoff_max_s",
    "give_up_s",
    "wait_timeout_s",
    "heartbeat_timeout_s",
)
"""The step's policy as stored with it (a run keeps the policy of its definition version)."""

STEP_COLUMNS: tuple[StepColumn, ...] = (
    StepColumn("run_id"),
    StepColumn("name", "text"),
    StepColumn("kind", "text"),
    StepColumn("agent", "text"),
    StepColumn("action", "text"),
    StepColumn("compensate_action", "text"),
    StepColumn("depends_on", "jsonb"),
    StepColumn("state", "text"),
    StepColumn("priority"),
    StepColumn("idempotency_key"),
    StepColumn("input"),
    # The definition's pool; the record's is the run's when the definition names none.
    StepColumn("pool", "text"),
    StepColumn("timeout_s", "float8"),
    StepColumn("max_failures", "int"),
    StepColumn("backoff_initial_s", "float8"),
    StepColumn("backoff_multiplier", "float8"),
    StepColumn("backoff_max_s", "float8"),
    StepColumn("give_up_s", "float8"),
    StepColumn("wait_timeout_s", "float8"),
    StepColumn("heartbeat_timeout_s", "float8"),
    StepColumn("park_exhausted", "boolean"),
    StepColumn("park_errors", "boolean"),
)
"""Every column a new step record is given, in the order the statements write them; the
others take their defaults."""

DEFINED_COLUMNS = tuple(c for c in STEP_COLUMNS if c.defined is not None)
"""The columns `defined_columns` returns, in order."""


def new_idempotency_key() -> str:
    """A fresh idempotency key: a random (version 4) UUID as 32 hex digits. The one-statement
    submission draws the same in SQL (NEW_IDEMPOTENCY_KEY_SQL)."""
    return uuid.uuid4().hex


NEW_IDEMPOTENCY_KEY_SQL = "replace(gen_random_uuid()::text, '-', '')"
"""`new_idempotency_key` drawn by PostgreSQL, for the steps it creates itself (drawing them in
Python would need the runs' documents joined back to the runs inserted)."""


def policy_columns(policy: StepPolicy) -> dict[str, Any]:
    """A definition's step policy as the columns of its step record."""
    return {
        "timeout_s": policy.timeout,
        "max_failures": policy.max_failures,
        "backoff_initial_s": policy.backoff.initial,
        "backoff_multiplier": policy.backoff.multiplier,
        "backoff_max_s": policy.backoff.maximum,
        "give_up_s": policy.give_up_after,
        "wait_timeout_s": policy.wait_timeout,
        "heartbeat_timeout_s": policy.heartbeat_timeout,
    }


def defined_columns(
    *,
    name: str,
    kind: StepKind,
    agent: str,
    action: str,
    depends_on: Sequence[str],
    policy: Mapping[str, Any],
    compensate_action: str | None = None,
    pool: str | None = None,
    parks: tuple[bool, bool] = (False, False),
) -> dict[str, Any]:
    """The values of DEFINED_COLUMNS (`policy`: the POLICY_COLUMNS; `parks`: whether the step
    parks when its failures run out, and on a permanent error: `Workflow.parks`, never for a
    compensation step)."""
    return {
        "name": name,
        "kind": kind,
        "agent": agent,
        "action": action,
        "compensate_action": compensate_action,
        "depends_on": list(depends_on),
        "state": StepState.WAITING if depends_on else StepState.PENDING,
        "pool": pool,
        **policy,
        "park_exhausted": parks[0],
        "park_errors": parks[1],
    }


def forward_definition(workflow: Workflow, name: str) -> dict[str, Any]:
    """The defined columns of a forward step of `workflow`."""
    step = workflow.step(name)
    return defined_columns(
        name=name,
        kind=StepKind.FORWARD,
        agent=step.agent,
        action=step.action,
        depends_on=workflow.dependencies[name],
        policy=policy_columns(step.policy),
        # A map's items carry its compensation (store.runs.mapping), not its own record.
        compensate_action=step.compensate if step.map_spec is None else None,
        pool=step.pool,
        parks=workflow.parks(name),
    )


def step_row(
    definition: Mapping[str, Any],
    *,
    run_id: int,
    priority: int,
    input: Any,  # noqa: A002 - the column's name
    pool: str | None,
) -> dict[str, Any]:
    """The values of one new step record (STEP_COLUMNS): `definition` (`defined_columns`) for
    run `run_id`, with a fresh idempotency key; `pool` replaces the definition's."""
    return {
        **definition,
        "run_id": run_id,
        "priority": priority,
        "idempotency_key": new_idempotency_key(),
        "input": input,
        "pool": pool,
    }
