"""The wire protocol: the JSON messages exchanged over RabbitMQ (docs/protocol.md describes them).

Every message is UTF-8 JSON; parsing raises InvalidMessageError with a readable reason, which the
consumer puts on the dead-lettered copy. Each consumer parses within its `Limits` (the largest
body, the deepest nesting), checked before the body is decoded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sasflow.commands import NewRun, StepOutcome, StepProgress, StoredError
from sasflow.errors import ConfigurationError, InvalidMessageError
from sasflow.states import ReplyStatus
from sasflow.workflow import NAME_PATTERN, WORKFLOW_NAME_PATTERN

PROTOCOL_VERSION = 1

_NAME = NAME_PATTERN.pattern
_WORKFLOW = WORKFLOW_NAME_PATTERN.pattern

MAX_MESSAGE_BYTES_VARIABLE = "SASFLOW_MAX_MESSAGE_BYTES"
MAX_JSON_DEPTH_VARIABLE = "SASFLOW_MAX_JSON_DEPTH"
# json.loads recurses once per level on the C stack, bounded by the interpreter's recursion
# limit (1000 by default): a configured depth stays well below it.
_DEPTH_CEILING = 500
_SIZE_FLOOR = 1024


@dataclass(frozen=True)
class Limits:
    """The largest message and the deepest JSON nesting a process accepts (docs/protocol.md,
    section 3). The depth counts the message's own object as level 1, so a submission's input
    object is level 2."""

    max_message_bytes: int = 1024 * 1024
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        if self.max_message_bytes < _SIZE_FLOOR:
            raise ConfigurationError(
                f"{MAX_MESSAGE_BYTES_VARIABLE} must be at least {_SIZE_FLOOR}, "
                f"got {self.max_message_bytes}"
            )
        if not 2 <= self.max_json_depth <= _DEPTH_CEILING:
            raise ConfigurationError(
                f"{MAX_JSON_DEPTH_VARIABLE} must be 2..{_DEPTH_CEILING}, got {self.max_json_depth}"
            )

    def check_size(self, size: int) -> None:
        """InvalidMessageError if a body of `size` bytes is too large."""
        if size > self.max_message_bytes:
            raise InvalidMessageError(
                f"message of {size} bytes exceeds the limit of {self.max_message_bytes} bytes "
                f"({MAX_MESSAGE_BYTES_VARIABLE})"
            )

    def check_depth(self, depth: int) -> None:
        if depth > self.max_json_depth:
            raise InvalidMessageError(
                f"JSON nested deeper than the limit of {self.max_json_depth} levels "
                f"({MAX_JSON_DEPTH_VARIABLE})"
            )


DEFAULT_LIMITS = Limits()


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=False)

    def encode(self) -> bytes:
        return self.model_dump_json(exclude_none=False).encode()


class Submission(_Message):
    """Asks for a new run of `workflow` (idempotent on workflow + key)."""

    workflow: str = Field(pattern=_WORKFLOW)
    input: dict[str, Any] = Field(default_factory=dict)
    key: str | None = Field(default=None, min_length=1, max_length=200)
    priority: int = Field(default=0, ge=-1000, le=1000)
    reply_to: str | None = Field(default=None, min_length=1, max_length=255)
    version: int | None = Field(default=None, ge=1)
    start_at: AwareDatetime | None = None
    """When the run's first steps may start (ISO 8601 with an offset); None or past: at once."""

    @field_validator("input", mode="before")
    @classmethod
    def _input_object(cls, value: Any) -> Any:
        # Refused here, not by the store's NOT NULL: input builders read fields of the input.
        if not isinstance(value, dict):
            shown = "null" if value is None else type(value).__name__
            raise ValueError(f"the run input must be a JSON object, got {shown}")  # noqa: TRY004
        return value

    @field_validator("reply_to")
    @classmethod
    def _short_string(cls, value: str | None) -> str | None:
        # AMQP routing keys are short strings: at most 255 bytes, not characters.
        if value is not None and len(value.encode("utf-8")) > 255:
            raise ValueError("reply_to must be at most 255 bytes in UTF-8")
        return value

    def new_run(self, trace_parent: str | None = None) -> NewRun:
        """The run this submission asks the store for (joining the trace `trace_parent`)."""
        return NewRun(
            trace_parent=trace_parent,
            workflow=self.workflow,
            input=self.input,
            key=self.key,
            priority=self.priority,
            version=self.version,
            reply_to=self.reply_to,
            start_at=self.start_at,
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
    """The execution clock: time the agent has for the attempt, from the moment it starts it."""
    complete_by: str
    """ISO-8601 deadline on the database clock (informative; agents time the budget locally)."""
    wait_ms: int | None = Field(default=None, ge=0)
    """The wait clock: how long the request could wait for an agent (its AMQP expiration).
    Present: the scheduler applies `started` and `heartbeat` messages (`Progress`); absent
    (an older scheduler): the agent sends none and times `budget_ms` from receipt."""
    heartbeat_ms: int | None = Field(default=None, ge=1)
    """The heartbeat clock: when set, the started attempt must heartbeat at least this often."""
    exclusive: bool = False
    """A concurrency limit covers the step (docs/flow-control.md): the agent acknowledges the
    request when a worker takes it, before the handler runs, so that the broker never delivers
    it again and the attempt runs at most once (the database's clocks recover it if the agent
    dies). Older agents ignore it and acknowledge after the reply."""
    map_index: int | None = Field(default=None, ge=0)
    """An item of a map step (`Step.map`): its index in the map's list; None otherwise. Older
    agents ignore it."""
    map_size: int | None = Field(default=None, ge=0)
    """An item of a map step: how many items the map has; None otherwise."""


class Fence(_Message):
    """The attempt a request names, read from a body that need not be a whole valid `Request`:
    an agent dead-letters exactly the requests it cannot parse, and the supervisor still counts
    them as a failure of that attempt."""

    step_id: int = Field(ge=1, le=2**63 - 1)
    attempt: int = Field(ge=1, le=2**31 - 1)


class Cancel(_Message):
    """Relay -> the instances of one agent (`<ns>.control`, routing key: the agent's name):
    stop the attempt `attempt` of step `step_id`, which an operator, the API or the run's
    deadline cancelled. Fenced: only an instance running exactly that attempt acts on it; the
    step is `cancelled` in the database already, whatever the agent does."""

    v: Literal[1] = 1
    step_id: int = Field(ge=1, le=2**63 - 1)
    run_id: int = Field(ge=1, le=2**63 - 1)
    attempt: int = Field(ge=1, le=2**31 - 1)
    agent: str = Field(pattern=_NAME)
    reason: str | None = Field(default=None, max_length=4000)
    event_id: int | None = Field(default=None, ge=1)
    """The step's `cancelled` event that caused it (deduplication, the timeline)."""


MAX_TRACEBACK_CHARS = 4096
"""The longest traceback an error keeps (its last characters, where the exception's line is)."""


class ErrorInfo(_Message):
    type: str = "Error"
    message: str = ""
    traceback: str | None = None
    """The handler's traceback (Python agents), bounded; absent from older agents' replies."""

    def stored(self) -> StoredError:
        if self.traceback is None:
            return StoredError(self.type, self.message)
        # Bounded here too: an agent in another language may send a longer one.
        kept = safe_text(self.traceback[-MAX_TRACEBACK_CHARS:], MAX_TRACEBACK_CHARS)
        return StoredError(self.type, self.message, {"traceback": kept})


class Reply(_Message):
    """Agent -> scheduler: the outcome of one attempt."""

    v: Literal[1] = 1
    step_id: int = Field(ge=1)
    attempt: int = Field(ge=1)
    status: ReplyStatus
    """ok: done; error: permanent failure; failed: transient failures outlasted the agent's
    retries before the deadline (counts one failure now); deferred: a dependency's breaker is
    open, try again after defer_seconds without counting a failure."""
    output: Any = None
    error: ErrorInfo | None = None
    defer_seconds: float | None = Field(default=None, ge=0, le=86400 * 7)
    agent: str | None = None

    @model_validator(mode="after")
    def _status_fields(self) -> Reply:
        if self.status in (ReplyStatus.ERROR, ReplyStatus.FAILED) and self.error is None:
            raise ValueError(f"an {self.status.value!r} reply needs an 'error' object")
        if self.status is ReplyStatus.DEFERRED and self.defer_seconds is None:
            raise ValueError("a 'deferred' reply needs 'defer_seconds'")
        return self

    def outcome(self) -> StepOutcome:
        """What this reply tells the store (its status is the outcome's kind)."""
        return StepOutcome(
            step_id=self.step_id,
            attempt=self.attempt,
            kind=self.status,
            output=self.output,
            error=self.error.stored() if self.error else None,
            defer_seconds=self.defer_seconds,
            agent=self.agent,
        )


ProgressType = Literal["step.started", "step.heartbeat"]
PROGRESS_TYPES: tuple[str, ...] = ("step.started", "step.heartbeat")


class Progress(_Message):
    """Agent -> scheduler, on the replies queue: an attempt started (a worker took the request,
    the execution clock runs from now) or is still alive (a heartbeat). Not an outcome: the
    attempt still ends with a `Reply`."""

    v: Literal[1] = 1
    type: ProgressType
    step_id: int = Field(ge=1, le=2**63 - 1)
    attempt: int = Field(ge=1, le=2**31 - 1)
    agent: str | None = Field(default=None, max_length=200)

    def progress(self) -> StepProgress:
        """What this message tells the store."""
        return StepProgress(
            step_id=self.step_id,
            attempt=self.attempt,
            started=self.type == "step.started",
            agent=self.agent,
        )


class Unknown(_Message):
    """A message on the replies queue of a kind this version does not know (a `type` under
    `step.` that it does not list): a newer agent's, acked and ignored, not dead-lettered."""

    type: str


def parse_on_replies(body: bytes, limits: Limits = DEFAULT_LIMITS) -> Reply | Progress | Unknown:
    """A message taken from the replies queue: a `Reply` (it has a `status`, or no `type`), a
    `Progress`, or `Unknown` (a `type` under `step.` that this version does not know);
    InvalidMessageError as `parse` raises it. The body is decoded once."""
    try:
        data = loads(body, limits)
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"Reply: {exc}") from exc
    if isinstance(data, dict) and "type" in data and "status" not in data:
        kind = data["type"]
        if kind in PROGRESS_TYPES:
            return _validate(Progress, data)
        if isinstance(kind, str) and kind.startswith("step."):
            return Unknown(type=kind[:100])
    return _validate(Reply, data)


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


M = TypeVar("M", bound=BaseModel)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(model: type[M], body: bytes, limits: Limits = DEFAULT_LIMITS) -> M:
    """Decode and validate one message body within `limits`; InvalidMessageError says what is
    wrong (the limit and its setting, for a body too large or too deep)."""
    try:
        data = loads(body, limits)
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"{model.__name__}: {exc}") from exc
    return _validate(model, data)


def _validate(model: type[M], data: Any) -> M:
    """`data` (decoded JSON) as a `model`, or InvalidMessageError saying what is wrong."""
    if not isinstance(data, dict):
        raise InvalidMessageError(
            f"{model.__name__}: body must be a JSON object, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except RecursionError as exc:
        raise InvalidMessageError(f"{model.__name__}: JSON nested too deeply") from exc
    except ValidationError as exc:
        raise InvalidMessageError(f"{model.__name__}: {problems_line(exc)}") from exc


def field_problems(
    errors: Iterable[Mapping[str, object]], *, whole: str = "<message>"
) -> list[tuple[str, str]]:
    """Each of pydantic's complaints (`ValidationError.errors()`, FastAPI's too) as (field,
    message): the field a dotted path (`input.items.0.name`, `whole` for the object itself),
    the message pydantic's one line, without its multi-line dump (input values, links)."""
    problems = []
    for err in errors:
        loc = err.get("loc", ())
        parts = loc if isinstance(loc, tuple | list) else (loc,)
        problems.append((".".join(str(part) for part in parts) or whole, str(err.get("msg", ""))))
    return problems


def problems_line(exc: ValidationError, *, whole: str = "<message>") -> str:
    """`field_problems` of `exc` as one line: `input: Input should be a valid dictionary;
    priority: ...`, for the messages of errors (a CLI's, an exception's)."""
    problems = field_problems(exc.errors(), whole=whole)
    return "; ".join(f"{field}: {message}" for field, message in problems)


def loads(body: bytes, limits: Limits = DEFAULT_LIMITS, *, what: str = "body") -> Any:
    """UTF-8 JSON within `limits`, or InvalidMessageError. The size is checked before anything
    is decoded, the depth by a scan before json.loads recurses into the body."""
    limits.check_size(len(body))
    limits.check_depth(nesting(body, limits.max_json_depth))
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise InvalidMessageError(f"{what} is not UTF-8 JSON: {exc}") from exc
    except RecursionError as exc:  # unreachable after nesting(); kept as the last resort
        raise InvalidMessageError("JSON nested too deeply") from exc


# UTF-8 continuation bytes are >= 0x80, so scanning the bytes never mistakes part of a character
# for a quote, a backslash or a bracket.
_KEEP = b'[]{}"'
_NOT_KEPT = bytes(b for b in range(256) if b not in _KEEP)
_STRING = re.compile(rb'"[^"]*"')
_ONE_BRACKET = bytes.maketrans(b"{}", b"[]")


def nesting(body: bytes, cap: int) -> int:
    """The deepest nesting of arrays and objects in JSON text, counting as far as `cap` + 1.

    Linear and in C: escaped backslashes and quotes are dropped, then everything but quotes and
    brackets, then the strings (with the brackets they hold); each round then removes the
    innermost `[]` pairs (one level), at most `cap` + 1 rounds. For text that is not JSON the
    answer is an upper bound of how deep json.loads would recurse before failing.
    """
    marks = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_KEPT)
    # Two adjacent quotes have no bracket between them, whether they end and start a string or
    # enclose one: dropping them changes nothing, and leaves the regex only strings that hold
    # brackets (few, in real data).
    marks = marks.replace(b'""', b"")
    brackets = _STRING.sub(b"", marks).translate(_ONE_BRACKET, b'"')
    if b"[" * (cap + 1) in brackets:  # the usual attack, answered without the rounds
        return cap + 1
    depth = 0
    while brackets and depth <= cap:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            # Unbalanced: "]]][[[" is left; json.loads fails, entering at most those "[".
            return depth + inner.count(b"[")
        brackets = inner
        depth += 1
    return depth + (1 if brackets else 0)


def value_depth(value: Any, cap: int) -> int:
    """The nesting of a Python value as JSON (a scalar is 0), counting as far as `cap` + 1,
    without recursion (the value may come from anywhere)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, BaseModel):
            item = dict(item)
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > cap:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def encode_within(message: _Message, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """`message` encoded, or InvalidMessageError if a consumer with `limits` would refuse it:
    a sender's check, so the refusal comes back to the caller instead of a dead-letter queue."""
    limits.check_depth(value_depth(message, limits.max_json_depth))
    try:
        body = message.encode()
    except ValueError as exc:  # pydantic cannot serialise a value
        raise InvalidMessageError(f"value is not JSON: {exc}") from exc
    limits.check_size(len(body))
    return body


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
