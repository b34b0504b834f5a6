"""Runs the browser tests make and wait for: runs of the `ops` test app, by key."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from sasflow import submit_run
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import ops


def submit(store: Engine, names: Names, key: str, **run_input: Any) -> int:
    """A run of `ops` with `run_input`; its id."""
    with store.begin() as conn:
        return submit_run(
            conn, ops.registry, "ops", run_input, key=key, namespace=names.namespace
        ).run_id


def wait_state(store: Engine, run_id: int, state: str) -> None:
    """Until run `run_id` is in `state`."""
    harness.wait_for(
        lambda: harness.run_states(store)[run_id] == state, what=f"run {run_id} {state}"
    )
