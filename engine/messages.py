"""The wire protocol: the JSON messages exchanged over RabbitMQ (docs/protocol.md describes them).

Every message is UTF-8 JSON; parsing raises InvalidMessageError with a readable reason, which the
consumer puts on the dead-lettered copy.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sasflow.errors import InvalidMessageError
from sasflow.store.commands import NewRun, OutcomeKind, StepOutcome, StoredError
from sasflow.workflow import NAME_PATTERN, WORKFLOW_NAME_PATTERN

PROTOCOL_VERSION = 1

_NAME = NAME_PATTERN.pattern
_WORKFLOW = WORKFLOW_NAME_PATTERN.pattern


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=False)

    def encode(self) -> bytes:
        return self.model_dump_json(exclude_none=False).encode()


class Submission(_Message):
    """Asks for a new run of `workflow` (idempotent on workflow + key)."""

    workflow: str = Field(pattern=_WORKFLOW)
    input: Any = Field(default_factory=dict)
    key: str | None = Field(default=None, min_length=1, max_length=200)
    priority: int = Field(default=0, ge=-1000, le=1000)
    reply_to: str | None = Field(default=None, min_length=1, max_length=255)
    version: int | None = Field(default=None, ge=1)

    @field_validator("reply_to")
    @classmethod
    def _short_string(cls, value: str | None) -> str | None:
        # AMQP routing keys are short strings: at most 255 bytes, not characters.
        if value is not None and len(value.encode("utf-8")) > 255:
            raise ValueError("reply_to must be at most 255 bytes in UTF-8")
        return value

    def new_run(self) -> NewRun:
        """The run this submission asks the store for."""
        return NewRun(
            workflow=self.workflow,
            input=self.input,
            key=self.key,
            priority=self.priority,
            version=self.version,
            reply_to=self.reply_to,
        )


class Request(_Message):
    """Scheduler -> agent: run `action` for one attempt of one step."""

    v: Literal[1] = 1
    step_id: int = Field(ge=1)
    run_id: int = Field(ge=1)
    attempt: int = Field(ge=1)
    workflow: str
    step: str
    agent: str = Field(pattern=_NAME)
    action: str = Field(pattern=_NAME)
    kind: Literal["forward", "compensation"] = "forward"
    input: Any = None
    idempotency_key: str = Field(min_length=1)
    budget_ms: int = Field(ge=0)
    complete_by: str
    """ISO-8601 deadline on the database clock (informative; agents time the budget locally)."""


class Fence(_Message):
    """The attempt a request names, read from a body that need not be a whole valid `Request`:
    an agent dead-letters exactly the requests it cannot parse, and the supervisor still counts
    them as a failure of that attempt."""

    step_id: int = Field(ge=1, le=2**63 - 1)
    attempt: int = Field(ge=1, le=2**31 - 1)


class ErrorInfo(_Message):
    type: str = "Error"
    message: str = ""

    def stored(self) -> StoredError:
        return StoredError(self.type, self.message)


class Reply(_Message):
    """Agent -> scheduler: the outcome of one attempt."""

    v: Literal[1] = 1
    step_id: int = Field(ge=1)
    attempt: int = Field(ge=1)
    status: Literal["ok", "error", "failed", "deferred"]
    """ok: done; error: permanent failure; failed: transient failures outlasted the agent's
    retries before the deadline (counts one failure now); deferred: a dependency's breaker is
    open, try again after defer_seconds without counting a failure."""
    output: Any = None
    error: ErrorInfo | None = None
    defer_seconds: float | None = Field(default=None, ge=0, le=86400 * 7)
    agent: str | None = None

    @model_validator(mode="after")
    def _status_fields(self) -> Reply:
        if self.status in ("error", "failed") and self.error is None:
            raise ValueError(f"an {self.status!r} reply needs an 'error' object")
        if self.status == "deferred" and self.defer_seconds is None:
            raise ValueError("a 'deferred' reply needs 'defer_seconds'")
        return self

    def outcome(self) -> StepOutcome:
        """What this reply tells the store (the statuses map one to one)."""
        return StepOutcome(
            step_id=self.step_id,
            attempt=self.attempt,
            kind=OutcomeKind(self.status),
            output=self.output,
            error=self.error.stored() if self.error else None,
            defer_seconds=self.defer_seconds,
            agent=self.agent,
        )


class StatusEvent(_Message):
    """Published on the status exchange (and to a run's reply_to) for every notable change."""

    v: Literal[1] = 1
    event_id: int
    run_id: int
    key: str
    workflow: str
    version: int
    entity: Literal["run", "step"]
    step: str | None = None
    state: str
    previous: str | None = None
    attempt: int | None = None
    at: str
    reason: str | None = None
    detail: Any = None


M = TypeVar("M", bound=_Message)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(model: type[M], body: bytes) -> M:
    """Decode and validate one message body; InvalidMessageError says what is wrong."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise InvalidMessageError(f"{model.__name__}: body is not UTF-8 JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidMessageError(f"{model.__name__}: JSON nested too deeply") from exc
    if not isinstance(data, dict):
        raise InvalidMessageError(
            f"{model.__name__}: body must be a JSON object, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except RecursionError as exc:
        raise InvalidMessageError(f"{model.__name__}: JSON nested too deeply") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<message>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InvalidMessageError(f"{model.__name__}: {problems}") from exc


def dumps(value: Any) -> str:
    """Compact JSON that every sasflow process can send and store, or InvalidMessageError.

    Rejects what JSON or the state store cannot hold: non-JSON types, NaN and infinities, lone
    surrogates (not UTF-8) and the NUL character (PostgreSQL's jsonb refuses it).
    """
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except RecursionError as exc:
        raise InvalidMessageError("value is nested too deeply") from exc
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(f"value holds text that is not UTF-8: {exc.reason}") from exc
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"value is not JSON: {exc}") from exc
    if "\\u0000" in text and _has_nul(value):  # cheap test first: rare in real data
        raise InvalidMessageError("value holds a NUL character (\\u0000), which cannot be stored")
    return text


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def safe_text(text: str, limit: int = 4000) -> str:
    """`text` made storable and sendable: no NUL, no lone surrogates, at most `limit` chars."""
    cleaned = text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")
    return cleaned[:limit]
