"""Runs that the SQLite store tests submit: `pipeline` runs of tests/apps/basic.py."""

from __future__ import annotations

from sqlalchemy import Engine

from sasflow import submit_run
from sasflow.store.db import transaction
from tests.apps import basic


def submit_pipelines(engine: Engine, count: int, prefix: str = "r") -> list[int]:
    """Submit `count` pipeline runs (keys `<prefix><i>`) in one transaction; their ids."""
    with transaction(engine) as conn:
        return [
            submit_run(
                conn,
                basic.registry,
                "pipeline",
                {"text": f"t{i}"},
                key=f"{prefix}{i}",
                namespace="t",
            ).run_id
            for i in range(count)
        ]
