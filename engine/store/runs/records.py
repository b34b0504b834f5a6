"""The rows advancing a run reads, as frozen types: the run (`queries.runs_by_id` and
`queries.lock_runs_of_steps`) and its steps (`queries.steps_of_runs`).

`from_row` takes a row's mapping (`row._mapping`) and names each column it keeps, so a column
the statement stops reading is a KeyError where the row is read, not an AttributeError deep in
a decision. States, kinds and errors are converted once, here. Plain Python: no SQLAlchemy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sasflow.commands import RunError
from sasflow.states import OnFailure, RunState, StepKind, StepState


class Columns(Protocol):
    """A row read by column name: a SQLAlchemy row's `_mapping`, or a dict."""

    def __getitem__(self, name: str, /) -> Any: ...


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as advancing it needs it."""

    id: int
    workflow: str
    version: int
    business_key: str
    input: Any
    state: RunState
    on_failure: OnFailure
    error: RunError | None
    parent_run_id: int | None = None
    """The run whose child step started it (Step.child); None for a run submitted otherwise."""

    @classmethod
    def from_row(cls, row: Columns) -> RunRecord:
        return cls(
            id=row["id"],
            workflow=row["workflow"],
            version=row["version"],
            business_key=row["business_key"],
            input=row["input"],
            state=RunState(row["state"]),
            on_failure=OnFailure(row["on_failure"]),
            error=RunError.from_json(row["error"]),
            parent_run_id=row["parent_run_id"],
        )


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step as advancing its run needs it; the policy columns (step_rows.POLICY_COLUMNS)
    travel to the compensation step that undoes it."""

    id: int
    run_id: int
    name: str
    kind: StepKind
    state: StepState
    depends_on: tuple[str, ...]
    attempt: int
    agent: str
    compensate_action: str | None
    priority: int
    pool: str | None
    input: Any
    output: Any
    error: Any
    """As the step stores it (JSON): a StoredError's JSON for every error sasflow writes."""
    timeout_s: float
    max_failures: int
    backoff_initial_s: float
    backoff_multiplier: float
    backoff_max_s: float
    give_up_s: float
    wait_timeout_s: float
    heartbeat_timeout_s: float | None
    map_parent: int | None = None
    """An item of a map step: its map's record (the map's own record and every other step:
    None)."""
    map_index: int | None = None
    map_size: int | None = None

    @property
    def is_map_item(self) -> bool:
        return self.map_index is not None

    @classmethod
    def from_row(cls, row: Columns) -> StepRecord:
        return cls(
            id=row["id"],
            run_id=row["run_id"],
            name=row["name"],
            kind=StepKind(row["kind"]),
            state=StepState(row["state"]),
            depends_on=tuple(row["depends_on"]),
            attempt=row["attempt"],
            agent=row["agent"],
            compensate_action=row["compensate_action"],
            priority=row["priority"],
            pool=row["pool"],
            input=row["input"],
            output=row["output"],
            error=row["error"],
            timeout_s=row["timeout_s"],
            max_failures=row["max_failures"],
            backoff_initial_s=row["backoff_initial_s"],
            backoff_multiplier=row["backoff_multiplier"],
            backoff_max_s=row["backoff_max_s"],
            give_up_s=row["give_up_s"],
            wait_timeout_s=row["wait_timeout_s"],
            heartbeat_timeout_s=row["heartbeat_timeout_s"],
            map_parent=row["map_parent"],
            map_index=row["map_index"],
            map_size=row["map_size"],
        )
