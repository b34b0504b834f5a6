"""Map steps (`Step.map`): a step that runs once per item of a list read from the run's data
(docs/concepts.md, "Map steps"). Declarative data, like conditions: `store/runs/decide.py`
reads the list, creates one step record per item and joins their outputs.

Plain Python: agents and the definitions import it without loading SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sasflow.errors import DefinitionError
from sasflow.waits import MISSING, MatchPath

MAX_NAME = 100
"""The width of a step's name (the column): a map's name plus `[<last index>]` fits in it."""
MAX_ITEMS = 100_000
"""The largest `max_items` a definition may declare (the items are created in one
transaction)."""


class OnItemFailure(StrEnum):
    """What a map does when one of its items fails for good."""

    FAIL_FAST = "fail_fast"
    """The map fails at once: items not started are skipped, items in flight finish."""
    CONTINUE = "continue"
    """Every item runs; the map completes with the outputs and the indexes that failed."""
    COMPENSATE = "compensate"
    """The map fails and the run compensates (whatever its failure policy): items done are
    undone in reverse index order when the map declares a compensation."""


class MapError(ValueError):
    """The value a map reads is not a list it can run over (missing, not a list, too long)."""


@dataclass(frozen=True)
class MapSpec:
    """A map step's definition (`Step.map`)."""

    items: MatchPath
    max_items: int
    parallelism: int
    on_item_failure: OnItemFailure

    @classmethod
    def of(
        cls, step: str, items: str, max_items: int, parallelism: int, on_item_failure: str
    ) -> MapSpec:
        where = f"map step {step!r}"
        try:
            path = MatchPath.parse(items, what="items")
        except DefinitionError as exc:
            raise DefinitionError(f"{where}: {exc}") from None
        for what, value, top in (
            ("max_items", max_items, MAX_ITEMS),
            ("parallelism", parallelism, None),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 1
                or (top is not None and value > top)
            ):
                bound = f"between 1 and {top}" if top is not None else ">= 1"
                raise DefinitionError(f"{where}: {what} must be an integer {bound}, got {value!r}")
        if on_item_failure not in set(OnItemFailure):
            raise DefinitionError(
                f"{where}: on_item_failure must be 'fail_fast', 'continue' or 'compensate', "
                f"got {on_item_failure!r}"
            )
        if len(item_name(step, max_items - 1)) > MAX_NAME:
            raise DefinitionError(
                f"{where}: its name is too long for the names of its items "
                f"({item_name(step, max_items - 1)!r} has more than {MAX_NAME} characters)"
            )
        return cls(path, max_items, parallelism, OnItemFailure(on_item_failure))

    def read(self, run_input: Any, outputs: Mapping[str, Any]) -> list[Any]:
        """The items at its path; MapError when there is no list of at most `max_items`."""
        value = self.items.value(run_input, outputs)
        if value is MISSING:
            raise MapError(f"{self.items} has no value")
        if not isinstance(value, list):
            raise MapError(f"{self.items} is a {type(value).__name__}, not a list")
        if len(value) > self.max_items:
            raise MapError(
                f"{self.items} has {len(value)} items, more than max_items={self.max_items}"
            )
        return value

    def shape(self) -> dict[str, Any]:
        """What a workflow's fingerprint takes of it."""
        return {
            "items": str(self.items),
            "max_items": self.max_items,
            "parallelism": self.parallelism,
            "on_item_failure": str(self.on_item_failure),
        }


def item_name(step: str, index: int) -> str:
    """The name of item `index` of map `step`'s record: `step[index]` (brackets are never in a
    step's own name)."""
    return f"{step}[{index}]"
