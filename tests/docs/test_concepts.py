"""docs/concepts.md draws the states the code really has."""

from __future__ import annotations

import re

from sasflow.store.schema import RUN_STATES, STEP_STATES
from tests.docs.markdown import REPO

DIAGRAM = re.compile(
    r"^## (?P<title>[^\n]+)\n(?:(?!^## ).)*?```mermaid\nstateDiagram-v2\n"
    r"(?P<body>.*?)```",
    re.MULTILINE | re.DOTALL,
)
TRANSITION = re.compile(r"^\s*(?P<source>\S+)\s*-->\s*(?P<target>[^:\s]+)", re.MULTILINE)
# Listed in the schema, entered by no step: compensation is tracked by the run's state and by
# compensation steps (rows of kind "compensation") with the ordinary states.
UNUSED_STEP_STATES = {"compensating", "compensated"}


def _diagrams() -> dict[str, set[str]]:
    text = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
    found: dict[str, set[str]] = {}
    for match in DIAGRAM.finditer(text):
        states = {
            name for m in TRANSITION.finditer(match["body"]) for name in (m["source"], m["target"])
        }
        found[match["title"]] = states - {"[*]"}
    return found


def test_the_run_diagram_has_exactly_the_run_states_of_the_schema() -> None:
    assert _diagrams()["States of a run"] == set(RUN_STATES)


def test_the_step_diagram_has_the_step_states_steps_enter() -> None:
    assert _diagrams()["States of a step"] == set(STEP_STATES) - UNUSED_STEP_STATES
    text = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
    assert "also holds `compensating` and `compensated`" in text
