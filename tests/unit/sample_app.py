"""A tiny app module for the appload tests (imported as tests.unit.sample_app)."""

from __future__ import annotations

from sasflow.registry import ExternalAgent, Registry
from sasflow.workflow import Step, Workflow


def _build(name: str) -> Registry:
    return Registry([Workflow(name, [Step("only", "remote", "run")])], [ExternalAgent("remote")])


registry = _build("default-attr")
other = _build("named-attr")
not_a_registry = 42


def make_registry() -> Registry:
    """A factory: load_registry calls it."""
    return _build("from-factory")


def make_nothing() -> str:
    """A factory that returns the wrong type."""
    return "not a registry"
