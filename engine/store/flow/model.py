"""What a flow limit is, validated without a database: its selector (an agent, some of its
actions or a dependency), its key, its rate (calls started per second, with a burst) and its
concurrency (steps in flight; 0 pauses). Shared by the store, the operator services and the
faces (CLI, API, console)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

from sasflow.errors import InvalidLimitError
from sasflow.workflow import NAME_PATTERN

LIMIT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")
"""Limit names: lower case, as they appear in metric labels and URLs."""
MAX_RATE = 1_000_000.0
MAX_COUNT = 1_000_000
MAX_ACTIONS = 100
_SEGMENT = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*([a-z]+))?\s*$")
_PERIODS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}


class KeyKind(StrEnum):
    INPUT = "input"
    BUSINESS_KEY = "business_key"
    WORKFLOW = "workflow"


@dataclass(frozen=True)
class KeyExpr:
    """A limit's key: `input.<dotted path>` (a value of the RUN's input, compared as text),
    `business_key` or `workflow`."""

    kind: KeyKind
    path: tuple[str, ...] = ()

    @staticmethod
    def parse(text: str) -> KeyExpr:
        if text == KeyKind.BUSINESS_KEY:
            return KeyExpr(KeyKind.BUSINESS_KEY)
        if text == KeyKind.WORKFLOW:
            return KeyExpr(KeyKind.WORKFLOW)
        head, _, rest = text.partition(".")
        path = tuple(rest.split(".")) if rest else ()
        if head != KeyKind.INPUT or not path or not all(_SEGMENT.fullmatch(p) for p in path):
            raise InvalidLimitError(
                f"key {text!r} must be `input.<field>[.<field>...]` (fields of letters, digits, "
                "'_', '-'), `business_key` or `workflow`"
            )
        return KeyExpr(KeyKind.INPUT, path)

    def __str__(self) -> str:
        if self.kind == KeyKind.INPUT:
            return "input." + ".".join(self.path)
        return str(self.kind)


@dataclass(frozen=True)
class Limit:
    """One limit (a row of flow_limits, validated)."""

    name: str
    agent: str
    actions: tuple[str, ...] | None = None
    """None: every action of the agent (or those of `dependency`)."""
    dependency: str | None = None
    """A breaker name: the agent's actions its live instances report using it."""
    key: KeyExpr | None = None
    rate: float | None = None
    """Steps started per second (every attempt), or None."""
    burst: int | None = None
    """Steps that may start at once after an idle period; None: max(1, ceil(rate))."""
    concurrency: int | None = None
    """Steps in flight at once (per key when keyed), or None; 0 pauses the selected steps."""
    enabled: bool = True

    def __post_init__(self) -> None:
        validate(self)

    @property
    def effective_burst(self) -> int:
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(self.rate or 1.0))

    def describe(self) -> str:
        """`100/s (burst 100), 40 at once, per input.account`, as operators read it."""
        parts = []
        if self.rate is not None:
            parts.append(f"{format_rate(self.rate)} (burst {self.effective_burst})")
        if self.concurrency is not None:
            parts.append("paused" if self.concurrency == 0 else f"{self.concurrency} at once")
        if self.key is not None:
            parts.append(f"per {self.key}")
        return ", ".join(parts)

    def selects(self, agent: str, action: str, dependency_actions: frozenset[str] | None) -> bool:
        """Whether a step of `agent`/`action` is limited by this limit; `dependency_actions`:
        what the fleet resolved `dependency` to (None: unresolved, nothing selected)."""
        if agent != self.agent:
            return False
        if self.dependency is not None:
            return dependency_actions is not None and action in dependency_actions
        return self.actions is None or action in self.actions


def validate(limit: Limit) -> None:
    """Raise InvalidLimitError unless `limit` is a usable definition."""
    if not LIMIT_NAME.fullmatch(limit.name):
        raise InvalidLimitError(
            f"limit name {limit.name!r} must match {LIMIT_NAME.pattern} (lower case letters, "
            "digits, '_', '.', '-'; at most 100 characters)"
        )
    _check_name("agent", limit.agent)
    if limit.actions is not None:
        if not limit.actions or len(limit.actions) > MAX_ACTIONS:
            raise InvalidLimitError(f"a limit names 1 to {MAX_ACTIONS} actions, or none (all)")
        for action in limit.actions:
            _check_name("action", action)
    if limit.dependency is not None:
        _check_name("dependency", limit.dependency)
        if limit.actions is not None:
            raise InvalidLimitError("a limit selects actions or a dependency, not both")
    if limit.rate is None and limit.concurrency is None:
        raise InvalidLimitError(f"limit {limit.name!r} needs a rate, a concurrency or both")
    if limit.rate is not None and not (0 < limit.rate <= MAX_RATE and math.isfinite(limit.rate)):
        raise InvalidLimitError(f"the rate must be > 0 and at most {MAX_RATE:g} per second")
    if limit.burst is not None:
        if limit.rate is None:
            raise InvalidLimitError("a burst needs a rate")
        if not 1 <= limit.burst <= MAX_COUNT:
            raise InvalidLimitError(f"the burst must be 1 to {MAX_COUNT}")
    if limit.concurrency is not None and not 0 <= limit.concurrency <= MAX_COUNT:
        raise InvalidLimitError(f"the concurrency must be 0 (paused) to {MAX_COUNT}")


def _check_name(kind: str, name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidLimitError(
            f"{kind} name {name!r} must match {NAME_PATTERN.pattern} (letters, digits, '_', '.', "
            "'-'; at most 100 characters)"
        )


def parse_rate(text: str) -> float:
    """`100/s`, `6000/min`, `5/h`, `2/day` or a bare number (per second) -> calls per second."""
    match = _RATE.fullmatch(text.lower())
    period = _PERIODS.get(match.group(2) or "s") if match else None
    if match is None or period is None:
        raise InvalidLimitError(
            f"rate {text!r} must be a number of calls per s, min, h or day, e.g. 100/s or 6000/min"
        )
    rate = float(match.group(1)) / period
    if not 0 < rate <= MAX_RATE:
        raise InvalidLimitError(f"the rate must be > 0 and at most {MAX_RATE:g} per second")
    return rate


def format_rate(rate: float) -> str:
    """A rate in the largest period that reads as a whole number: `100/s`, `6/min`."""
    for unit, seconds in (("s", 1.0), ("min", 60.0), ("h", 3600.0), ("day", 86400.0)):
        count = rate * seconds
        if count >= 1 and abs(count - round(count)) < 1e-9:
            return f"{round(count)}/{unit}"
    return f"{rate:.6g}/s"
