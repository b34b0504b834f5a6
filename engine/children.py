"""Child workflows (`Step.child`): a step that submits a run of another workflow and completes
with its outcome (docs/concepts.md, "Child workflows"). Declarative data, like maps: the store
(`store/runs/children.py`) creates the child run when the step becomes ready and ends the step
when the child ends.

Plain Python: agents and the definitions import it without loading SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sasflow.errors import DefinitionError
from sasflow.waits import MatchPath

CHILD_AGENT = "sasflow.child"
"""The agent name of child steps (`Step.child`): reserved, no agent runs them; their action is
the child's workflow name."""

CHILD_KEY = "child"
"""The key of a child step's input once its child run exists: `{"child": {"run_id": ...}}`."""

MAX_DEPTH = 5
"""How deep runs may nest: a run at depth 5 (its parent chain 5 runs long) starts no child."""

MAX_CHILDREN = 100
"""The most child runs one run may start (its child steps)."""


def child_key(run_id: int, step: str) -> str:
    """The business key of the child run of step `step` of run `run_id`: one child per (parent
    run, step), whatever retries or second decisions make the step ready again."""
    return f"parent:{run_id}:{step}"


@dataclass(frozen=True)
class ChildSpec:
    """A child step's definition (`Step.child`)."""

    workflow: str
    version: int | None
    input: MatchPath | None
    """Where the child's input is read (None: the parent run's input)."""

    @classmethod
    def of(cls, step: str, workflow: str, version: int | None, input: str | None) -> ChildSpec:  # noqa: A002
        where = f"child step {step!r}"
        if not isinstance(workflow, str) or not workflow:
            raise DefinitionError(f"{where}: workflow must be a workflow's name")
        if version is not None and (
            isinstance(version, bool) or not isinstance(version, int) or version < 1
        ):
            raise DefinitionError(f"{where}: version must be an integer >= 1 or None")
        return cls(workflow, version, None if input is None else _parse(where, input))

    def read(self, run_input: Any, outputs: Mapping[str, Any]) -> Any:
        """The child's input: the value at its path (`waits.MISSING` when it leads nowhere),
        or the parent run's input."""
        if self.input is None:
            return run_input
        return self.input.value(run_input, outputs)

    def shape(self) -> dict[str, Any]:
        """What a workflow's fingerprint takes of it."""
        return {
            "workflow": self.workflow,
            "version": self.version,
            "input": None if self.input is None else str(self.input),
        }


def _parse(where: str, text: str) -> MatchPath:
    """`steps.<step>` (a step's whole output), or a path as `MatchPath` reads it."""
    parts = text.split(".") if isinstance(text, str) else []
    if len(parts) == 2 and parts[0] == "steps" and parts[1]:
        return MatchPath(parts[1], ())
    try:
        return MatchPath.parse(text, what="input")
    except DefinitionError as exc:
        raise DefinitionError(f"{where}: {exc} (or `steps.<step>`)") from None
