"""What the store is asked to record, in its own terms: a new run, the outcome of a step's
attempt, a step's or a run's error. The wire messages (`sasflow.messages`) are translated into
these at the edge, so the store knows nothing of AMQP bodies and a scheduler fails a step
without fabricating a reply. Plain Python: no SQLAlchemy here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sasflow.errors import InvalidInputError, UnknownWorkflowError
from sasflow.states import ReplyStatus, RunState


@dataclass(frozen=True)
class StoredError:
    """An error as steps and runs store it (the `error` column, JSON): a type and a message,
    plus optional fields (e.g. who cancelled)."""

    type: str
    message: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, **self.extra}


@dataclass(frozen=True)
class RunError:
    """Why a run failed, as the run stores it (the `error` column, JSON; docs/protocol.md 7.3):
    the error of the step that failed, stored as `{"step": name, "error": <the step's error>}`
    (with `"compensation": true` between them when a compensating step failed), or an error of
    the run itself (an output builder failed, the workflow is not loaded, an operator
    cancelled), stored as that error's JSON."""

    error: Any
    """The failed step's error as the step stores it, or the run's own error (JSON)."""
    step: str | None = None
    """The step that failed; None for an error of the run itself."""
    compensation: bool = False
    """The step that failed was a compensating step (the run is `compensation_failed`)."""

    @classmethod
    def of_run(cls, error: StoredError) -> RunError:
        """An error of the run itself."""
        return cls(error.to_json())

    def to_json(self) -> Any:
        if self.step is None:
            return self.error
        if self.compensation:
            return {"step": self.step, "compensation": True, "error": self.error}
        return {"step": self.step, "error": self.error}

    @classmethod
    def from_json(cls, value: Any) -> RunError | None:
        """What a run stores (None for no error). A value `to_json` does not write for a step is
        kept whole as an error of the run, so `to_json` gives back exactly what was read."""
        if value is None:
            return None
        if isinstance(value, dict) and isinstance(value.get("step"), str):
            if value.keys() == {"step", "error"}:
                return cls(value["error"], value["step"])
            if value.keys() == {"step", "compensation", "error"} and value["compensation"] is True:
                return cls(value["error"], value["step"], compensation=True)
        return cls(value)

    def describe(self) -> str:
        """The error for an alert's message: `Type: message`, else the stored JSON as text."""
        if isinstance(self.error, dict) and "message" in self.error:
            return f"{self.error.get('type', 'Error')}: {self.error['message']}"
        return str(self.to_json())


@dataclass(frozen=True)
class StepOutcome:
    """The outcome of attempt `attempt` of step `step_id`; applied only if the step is still
    processing that attempt (fencing)."""

    step_id: int
    attempt: int
    kind: ReplyStatus
    output: Any = None
    error: StoredError | None = None
    defer_seconds: float | None = None
    agent: str | None = None
    """The agent instance that answered, recorded with an error for the operator."""


@dataclass(frozen=True)
class StepProgress:
    """An agent says attempt `attempt` of step `step_id` started (`started`) or is alive (a
    heartbeat); applied only while the step is still processing that attempt (fencing)."""

    step_id: int
    attempt: int
    started: bool
    agent: str | None = None


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
    start_at: datetime | None = None
    """When its first steps may be claimed (timezone-aware; the database clock decides when it
    has come); None or a past time: at once."""


@dataclass(frozen=True)
class SubmitResult:
    """The run a submission maps to; `created` is False for a duplicate (same workflow and key),
    and `input_differs` True when that duplicate's input is not the recorded run's (the
    recorded run is kept as it is: this input was not used)."""

    run_id: int
    business_key: str
    created: bool
    state: str
    input_differs: bool = False

    def conflict(self, workflow: str) -> str | None:
        """What a duplicate with another input means, for people (the CLI's error line, the
        API's `message`); None when the input was the recorded one's or the run is new."""
        if not self.input_differs:
            return None
        return (
            f"key {self.business_key!r} names run {self.run_id} of {workflow}, recorded with "
            "another input: that run is kept as it is and this input was not used (submit it "
            "with another key)"
        )


@dataclass(frozen=True)
class FinishedRun:
    """A run that reached a terminal state in a transaction, as the hooks' `runs_finished`
    receives it (the metrics count it by workflow and state)."""

    state: RunState
    workflow: str


@dataclass(frozen=True)
class Refused:
    """A submission not recorded, and why: its workflow is unknown, its input is not JSON or a
    first step's input cannot be built, or the database refused its data."""

    error: UnknownWorkflowError | InvalidInputError

    @property
    def reason(self) -> str:
        return str(self.error)
