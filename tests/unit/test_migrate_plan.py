"""The plan of `sasflow runs migrate` for one run, without I/O (sasflow.ops.migrate): steps
matched by name or by a rename, new ones added, never-started ones removed, done ones kept as
history, one in flight refusing the run; and the renames checked against both versions."""

from __future__ import annotations

import pytest

from sasflow import Registry, Step, Workflow
from sasflow.agents import Agent
from sasflow.errors import InvalidInputError
from sasflow.ops.migrate import Migration, OldStep, definitions, plan

OLD = Workflow("w", [Step("a", "x", "a"), Step("b", "x", "b", after=("a",))], version=1)
NEW = Workflow(
    "w", [Step("b", "x", "b"), Step("a", "x", "a", after=("b",)), Step("c", "x", "c")], version=2
)
AGENT = Agent("x")
for _action in "abc":
    AGENT.handler(_action)(lambda _call: {})
REGISTRY = Registry([OLD, NEW], [AGENT])


def test_a_swap_keeps_both_steps_under_each_others_names() -> None:
    steps = [OldStep(1, "a", "processed", 1), OldStep(2, "b", "processing", 1)]
    planned = plan(7, steps, NEW, {"a": "b", "b": "a"})
    assert planned.refused is None
    assert planned.diff() == {
        "added": ["c"],
        "renamed": {"a": "b", "b": "a"},
        "kept": ["a", "b"],
        "removed": [],
        "history": [],
    }


@pytest.mark.parametrize(
    ("state", "attempt", "outcome"),
    [
        ("waiting", 0, "removed"),
        ("pending", 0, "removed"),
        ("processed", 1, "history"),
        ("skipped", 0, "history"),
        ("processing", 1, "refused"),
        ("pending", 2, "refused"),  # a retry: the earlier attempt's outcome is unknown
    ],
)
def test_a_step_the_new_version_lacks(state: str, attempt: int, outcome: str) -> None:
    only_b = Workflow("w", [Step("b", "x", "b")], version=3)
    planned = plan(7, [OldStep(1, "a", state, attempt), OldStep(2, "b", "waiting", 0)], only_b, {})
    found = {
        "removed": planned.removed == ["a"],
        "history": planned.history == ["a"],
        "refused": planned.refused is not None
        and f"'a' ({state}, attempt {attempt})" in planned.refused,
    }
    assert [k for k, v in found.items() if v] == [outcome]


@pytest.mark.parametrize(
    ("renames", "message"),
    [
        ({"z": "a"}, "--map z=a: version 1 of w has no step 'z' (its steps: a, b)"),
        ({"a": "z"}, "--map a=z: version 2 of w has no step 'z' (its steps: b, a, c)"),
        ({"a": "b"}, "steps 'a' and 'b' of version 1 would both become 'b'"),
    ],
)
def test_renames_are_checked_against_both_versions(renames: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        definitions(REGISTRY, Migration("w", 1, 2, renames))
    assert str(refused.value).startswith(message)


def test_the_same_version_twice_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="are the same version"):
        definitions(REGISTRY, Migration("w", 2, 2))
