"""The order of a claim's steps (store.runs.claim.claim_order), the same on PostgreSQL and
SQLite: highest priority first, then by id."""

from __future__ import annotations

from sqlalchemy import Engine

from sasflow import submit_run
from sasflow.store.db import transaction
from sasflow.store.runs.claim import claim_steps
from tests.apps import basic

PRIORITIES = [0, 5, -1, 5, 9, 0, -1, 9, 3, 0]
"""Later runs often higher: the id order alone, or the priority alone, is not the answer."""


def claimed_in_order(engine: Engine) -> None:
    """Submit pipelines of PRIORITIES and claim their first steps in one claim: they come
    highest priority first, equal priorities by step id."""
    with transaction(engine) as conn:
        for i, priority in enumerate(PRIORITIES):
            submit_run(
                conn,
                basic.registry,
                "pipeline",
                {"text": f"t{i}"},
                key=f"order{i}",
                priority=priority,
                namespace="t",
            )
    with transaction(engine) as conn:
        claimed = claim_steps(conn, locked_by="s1", batch=len(PRIORITIES))
    got = [(c.priority, c.id) for c in claimed]
    assert len(got) == len(PRIORITIES)
    assert got == sorted(got, key=lambda p: (-p[0], p[1])), got
