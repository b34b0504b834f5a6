"""Event waits (`Step.wait_for`): a step that waits for a named event whose correlation value
matches one read from the run's data, with a timeout and what to do when it passes
(docs/concepts.md, "Event waits"). No agent runs it: the schedulers match stored events to open
waits (sasflow.store.inbound) and apply the timeout.

What the step needs at run time is written into its input when it opens (`WaitSpec.input`),
so the row alone says what it waits for: a scheduler without the definition can still match
and time it out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sasflow.errors import DefinitionError

EVENT_AGENT = "sasflow.event"
"""The agent name of event-wait steps (`Step.wait_for`): reserved, no agent runs them; their
action is the event's name."""

MAX_CORRELATION = 200
"""The longest correlation value (characters), the column's width."""

_SEGMENT = re.compile(r"^[A-Za-z0-9_-]{1,100}$")

MISSING: Any = object()
"""What `MatchPath.value` returns when its path leads nowhere."""


class OnTimeout(StrEnum):
    """What an event wait does when its timeout passes without its event."""

    FAIL = "fail"
    """The step fails (`EventTimeout`): the run's failure policy applies."""
    COMPENSATE = "compensate"
    """The step fails and the run compensates, whatever its failure policy."""
    DEFAULT = "default"
    """The step completes with the `Default`'s value as its output."""


@dataclass(frozen=True)
class Default:
    """`on_timeout=Default(value)`: at the timeout the wait completes with `value` (JSON) as
    its output."""

    value: Any = None


@dataclass(frozen=True)
class MatchPath:
    """Where a wait reads its correlation value: `input.<field>[.<field>...]` (the run's
    input) or `steps.<step>.<field>[...]` (an earlier step's output). The value is compared as
    text (a number 42 matches the correlation "42")."""

    source: str
    """"input", or the name of the step whose output is read."""
    path: tuple[str, ...]

    @staticmethod
    def parse(text: str, *, what: str = "match") -> MatchPath:
        parts = text.split(".")
        if parts[0] == "input" and len(parts) >= 2 and all(map(_SEGMENT.fullmatch, parts[1:])):
            return MatchPath("input", tuple(parts[1:]))
        if parts[0] == "steps" and len(parts) >= 3 and all(map(_SEGMENT.fullmatch, parts[1:])):
            if parts[1] == "input":  # the source "input" is the run's input: never a step
                raise DefinitionError(
                    f"match {text!r}: a step named 'input' cannot be read by a path "
                    "(`input.<field>` is the run's input): rename the step"
                )
            return MatchPath(parts[1], tuple(parts[2:]))
        raise DefinitionError(
            f"{what} {text!r} must be `input.<field>[.<field>...]` or "
            "`steps.<step>.<field>[.<field>...]` (fields of letters, digits, '_', '-')"
        )

    def read(self, run_input: Any, outputs: Mapping[str, Any]) -> str | None:
        """The correlation value as text, or None when the path leads nowhere (or to null)."""
        value = self.value(run_input, outputs)
        if value is MISSING or value is None or isinstance(value, dict | list):
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def value(self, run_input: Any, outputs: Mapping[str, Any]) -> Any:
        """The JSON value at the path, or MISSING when it leads nowhere (a step without an
        output in `outputs`, a field not there)."""
        if self.source != "input" and self.source not in outputs:
            return MISSING
        value = run_input if self.source == "input" else outputs[self.source]
        for segment in self.path:
            if not isinstance(value, dict) or segment not in value:
                return MISSING
            value = value[segment]
        return value

    def __str__(self) -> str:
        head = "input" if self.source == "input" else f"steps.{self.source}"
        return ".".join((head, *self.path))


@dataclass(frozen=True)
class WaitSpec:
    """An event wait's definition (`Step.wait_for`)."""

    event: str
    match: MatchPath
    timeout: float
    on_timeout: OnTimeout
    default: Any = None

    @classmethod
    def of(
        cls, step: str, event: str, match: str, timeout: float, on_timeout: str | Default
    ) -> WaitSpec:
        if not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout > 0
        ):
            raise DefinitionError(f"event wait {step!r}: timeout must be > 0, got {timeout!r}")
        try:
            parsed = MatchPath.parse(match)
        except DefinitionError as exc:
            raise DefinitionError(f"event wait {step!r}: {exc}") from None
        if isinstance(on_timeout, Default):
            return cls(event, parsed, float(timeout), OnTimeout.DEFAULT, on_timeout.value)
        if on_timeout not in {OnTimeout.FAIL, OnTimeout.COMPENSATE}:
            raise DefinitionError(
                f"event wait {step!r}: on_timeout must be 'fail', 'compensate' or "
                f"Default(value), got {on_timeout!r}"
            )
        return cls(event, parsed, float(timeout), OnTimeout(on_timeout))

    def input(self, correlation: str) -> dict[str, Any]:
        """The step's input once open: what it waits for and what its timeout does."""
        found: dict[str, Any] = {
            "event": self.event,
            "correlation": correlation,
            "timeout_s": self.timeout,
            "on_timeout": str(self.on_timeout),
        }
        if self.on_timeout == OnTimeout.DEFAULT:
            found["default"] = self.default
        return found

    def shape(self) -> dict[str, Any]:
        """What a workflow's fingerprint takes of it."""
        return {
            "event": self.event,
            "match": str(self.match),
            "timeout": self.timeout,
            "on_timeout": str(self.on_timeout),
            "default": self.default,
        }
