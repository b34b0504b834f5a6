"""Conditions (`Step(..., when=...)`): declarative data over the run's input and earlier steps'
outputs, never Python callables, so any scheduler decides them inside the transaction that
would make the step ready (store.runs.decide) and a workflow's fingerprint covers them
(docs/concepts.md, "Conditions").

`Cond(path, op, value)` reads `path` (`input.<field>...` or `steps.<step>.<field>...`, as an
event wait's `match`) and compares it with a JSON literal; `All`, `Any` and `Not` combine
conditions. Evaluating one returns whether it holds and the values it read, which the step's
history records; a comparison the values cannot make (`"a" < 3`) raises `ConditionError`.
"""

from __future__ import annotations

import operator
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from sasflow.errors import DefinitionError
from sasflow.waits import MISSING, MatchPath

JSON = typing.Any
"""A JSON value (`typing.Any`: this module's `Any` is the combinator)."""

Scalar = str | int | float | bool | None
"""A JSON scalar: what a condition compares with."""

_COMPARE: dict[str, Callable[[JSON, JSON], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MEMBERSHIP = frozenset({"in", "not in"})
_UNARY = frozenset({"exists", "truthy"})
OPERATORS = (*_COMPARE, *sorted(_MEMBERSHIP), *sorted(_UNARY))
"""Every operator `Cond` takes."""
_ORDERING = frozenset({"<", "<=", ">", ">="})


class ConditionError(ValueError):
    """A condition compared values it cannot order (a step that reads them fails with it)."""


Values = dict[str, JSON]
"""The values a condition read, by path (a path that leads nowhere: absent from the map)."""


@dataclass(frozen=True)
class Cond:
    """`path op value`: `Cond("steps.charge.captured", "==", True)`,
    `Cond("input.country", "in", ["FR", "DE"])`, `Cond("input.coupon", "exists")`.

    A path that leads nowhere (a skipped step's output, a field not there) reads as null:
    `exists` is false, `truthy` is false, `== None` holds; ordering it is a ConditionError.
    `exists` is true for a value that is not null; `truthy` as in Python (0, "", [], {} and
    false are not)."""

    path: str
    op: str
    value: JSON = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str):
            raise DefinitionError(f"condition path must be a string, got {self.path!r}")
        MatchPath.parse(self.path, what="condition path")
        if self.op not in OPERATORS:
            raise DefinitionError(
                f"condition {self.path!r}: operator {self.op!r} is not one of "
                f"{', '.join(OPERATORS)}"
            )
        if self.op in _UNARY:
            if self.value is not None:
                raise DefinitionError(f"condition {self.path!r} {self.op}: takes no value")
        elif self.op in _MEMBERSHIP:
            if not isinstance(self.value, list | tuple) or not all(map(_scalar, self.value)):
                raise DefinitionError(
                    f"condition {self.path!r} {self.op}: the value must be a list of JSON "
                    f"scalars, got {self.value!r}"
                )
            object.__setattr__(self, "value", tuple(self.value))
        elif not _scalar(self.value):
            raise DefinitionError(
                f"condition {self.path!r} {self.op}: the value must be a JSON scalar "
                f"(string, number, boolean, None), got {self.value!r}"
            )
        elif self.op in _ORDERING and (self.value is None or isinstance(self.value, bool)):
            raise DefinitionError(
                f"condition {self.path!r} {self.op}: orders numbers or strings, got {self.value!r}"
            )

    @property
    def source(self) -> MatchPath:
        return MatchPath.parse(self.path)

    def evaluate(self, run_input: JSON, outputs: Mapping[str, JSON], read: Values) -> bool:
        value = self.source.value(run_input, outputs)
        if value is not MISSING:
            read[self.path] = value
        found = None if value is MISSING else value
        if self.op == "exists":
            return found is not None
        if self.op == "truthy":
            return bool(found)
        if self.op in _MEMBERSHIP:
            inside = any(_equal(found, v) for v in self.value)
            return inside if self.op == "in" else not inside
        if self.op in _ORDERING and not _orderable(found, self.value):
            raise ConditionError(f"{self}: cannot order {found!r} against {self.value!r}")
        if self.op in {"==", "!="}:
            return _equal(found, self.value) == (self.op == "==")
        return _COMPARE[self.op](found, self.value)

    def shape(self) -> JSON:
        return [self.path, self.op, list(self.value) if self.op in _MEMBERSHIP else self.value]

    def paths(self) -> Iterator[MatchPath]:
        yield self.source

    def __str__(self) -> str:
        if self.op in _UNARY:
            return f"{self.path} {self.op}"
        shown = list(self.value) if self.op in _MEMBERSHIP else self.value
        return f"{self.path} {self.op} {shown!r}"


@dataclass(frozen=True, init=False)
class _Group:
    """Conditions read in order (`All`, `Any`)."""

    conditions: tuple[Condition, ...]
    _joiner: ClassVar[str]

    def __init__(self, *conditions: Condition) -> None:
        object.__setattr__(self, "conditions", _operands(type(self).__name__, conditions))

    def shape(self) -> JSON:
        return {type(self).__name__.lower(): [c.shape() for c in self.conditions]}

    def paths(self) -> Iterator[MatchPath]:
        for c in self.conditions:
            yield from c.paths()

    def __str__(self) -> str:
        return "(" + f" {self._joiner} ".join(map(str, self.conditions)) + ")"


class All(_Group):
    """Holds when every one of its conditions holds (read in order, stopping at the first that
    does not: `All(Cond(p, "exists"), Cond(p, ">", 3))` never orders a missing value)."""

    _joiner = "and"

    def evaluate(self, run_input: JSON, outputs: Mapping[str, JSON], read: Values) -> bool:
        return all(c.evaluate(run_input, outputs, read) for c in self.conditions)


class Any(_Group):
    """Holds when one of its conditions holds (read in order, stopping at the first that
    does)."""

    _joiner = "or"

    def evaluate(self, run_input: JSON, outputs: Mapping[str, JSON], read: Values) -> bool:
        return any(c.evaluate(run_input, outputs, read) for c in self.conditions)


@dataclass(frozen=True)
class Not:
    """Holds when its condition does not."""

    condition: Condition

    def __post_init__(self) -> None:
        _operands("Not", (self.condition,))

    def evaluate(self, run_input: JSON, outputs: Mapping[str, JSON], read: Values) -> bool:
        return not self.condition.evaluate(run_input, outputs, read)

    def shape(self) -> JSON:
        return {"not": self.condition.shape()}

    def paths(self) -> Iterator[MatchPath]:
        yield from self.condition.paths()

    def __str__(self) -> str:
        return f"not {self.condition}"


Condition = Cond | All | Any | Not


@dataclass(frozen=True)
class Decision:
    """A condition evaluated: whether it holds and the values it read (the history's)."""

    holds: bool
    values: Values

    def detail(self, condition: Condition) -> dict[str, JSON]:
        """The skipped step's event detail."""
        return {"condition": str(condition), "values": self.values}


def evaluate(condition: Condition, run_input: JSON, outputs: Mapping[str, JSON]) -> Decision:
    """Whether `condition` holds over the run's input and the processed steps' outputs, with
    the values it read; ConditionError when it orders values that have no order."""
    read: Values = {}
    return Decision(condition.evaluate(run_input, outputs, read), read)


def _operands(kind: str, conditions: tuple[object, ...]) -> tuple[Condition, ...]:
    if kind != "Not" and not conditions:
        raise DefinitionError(f"{kind}() needs at least one condition")
    found: list[Condition] = []
    for c in conditions:
        if not isinstance(c, Cond | All | Any | Not):
            raise DefinitionError(f"{kind}() takes conditions (Cond, All, Any, Not), got {c!r}")
        found.append(c)
    return tuple(found)


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _equal(left: object, right: object) -> bool:
    """JSON equality: true is not 1."""
    if isinstance(left, bool) != isinstance(right, bool):
        return False
    return left == right


def _orderable(left: object, right: object) -> bool:
    def number(v: object) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    return (number(left) and number(right)) or (isinstance(left, str) and isinstance(right, str))
