"""docs/concepts.md draws the states the code really has."""

from __future__ import annotations

import re

from sasflow.states import RunState, StepState
from tests.docs.markdown import REPO

DIAGRAM = re.compile(
    r"^## (?P<title>[^\n]+)\n(?:(?!^## ).)*?```mermaid\nstateDiagram-v2\n"
    r"(?P<body>.*?)```",
    re.MULTILINE | re.DOTALL,
)
TRANSITION = re.compile(r"^\s*(?P<source>\S+)\s*-->\s*(?P<target>[^:\s]+)", re.MULTILINE)


def _diagrams() -> dict[str, set[str]]:
    text = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
    found: dict[str, set[str]] = {}
    for match in DIAGRAM.finditer(text):
        states = {
            name for m in TRANSITION.finditer(match["body"]) for name in (m["source"], m["target"])
        }
        found[match["title"]] = states - {"[*]"}
    return found


def test_the_run_diagram_has_exactly_the_run_states() -> None:
    assert _diagrams()["States of a run"] == {state.value for state in RunState}


def test_the_step_diagram_has_exactly_the_step_states() -> None:
    assert _diagrams()["States of a step"] == {state.value for state in StepState}
