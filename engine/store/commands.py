"""What the store is asked to record, in its own terms: a new run, the outcome of a step's
attempt, an error. The wire messages (`sasflow.messages`) are translated into these at the
edge, so the store knows nothing of AMQP bodies and a scheduler fails a step without
fabricating a reply. Plain Python: no SQLAlchemy here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sasflow.errors import InvalidInputError, UnknownWorkflowError


@dataclass(frozen=True)
class StoredError:
    """An error as steps and runs store it (the `error` column, JSON): a type and a message,
    plus optional fields (e.g. who cancelled)."""

    type: str
    message: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, **self.extra}


class OutcomeKind(StrEnum):
    """How an attempt ended. The value is recorded as the reason of the step's event."""

    OK = "ok"
    """Done: the step is processed with its output."""
    ERROR = "error"
    """A permanent failure: the step goes to error (no retry)."""
    FAILED = "failed"
    """Transient failures outlasted the agent's retries: one failure is counted now."""
    DEFERRED = "deferred"
    """A dependency is unavailable (open breaker): try again later, no failure counted while
    the step is younger than its give-up age."""


@dataclass(frozen=True)
class StepOutcome:
    """The outcome of attempt `attempt` of step `step_id`; applied only if the step is still
    processing that attempt (fencing)."""

    step_id: int
    attempt: int
    kind: OutcomeKind
    output: Any = None
    error: StoredError | None = None
    defer_seconds: float | None = None
    agent: str | None = None
    """The agent instance that answered, recorded with an error for the operator."""


@dataclass(frozen=True)
class NewRun:
    """A run to record: idempotent on (workflow, key); no key means a generated one."""

    workflow: str
    input: Any
    key: str | None = None
    priority: int = 0
    version: int | None = None
    reply_to: str | None = None
    submitted_by: str | None = None
    """The API token's name, for submissions over HTTP."""
    callback_url: str | None = None
    """POSTed the run's summary when it ends (HTTP submissions)."""
    pool: str | None = None
    """The agent pool of its steps, unless a step's definition names its own."""
    trace_parent: str | None = None
    """W3C traceparent of the trace the run joins (tracing on), else None."""


@dataclass(frozen=True)
class SubmitResult:
    """The run a submission maps to; `created` is False for a duplicate (same workflow and key)."""

    run_id: int
    business_key: str
    created: bool
    state: str


@dataclass(frozen=True)
class Refused:
    """A submission not recorded, and why: its workflow is unknown, its input is not JSON or a
    first step's input cannot be built, or the database refused its data."""

    error: UnknownWorkflowError | InvalidInputError

    @property
    def reason(self) -> str:
        return str(self.error)
