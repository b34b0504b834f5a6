"""The trace context stored with a run: set once, never overwritten (SQLite; the acceptance
test covers PostgreSQL)."""

from __future__ import annotations

from sqlalchemy import Engine

from sasflow import submit_run
from sasflow.store.runs import traces
from tests.apps.basic import registry

FIRST = f"00-{'a' * 32}-{'b' * 16}-01"
SECOND = f"00-{'c' * 32}-{'d' * 16}-01"


def test_a_run_keeps_the_first_trace_context_stored(sqlite_engine: Engine) -> None:
    with sqlite_engine.begin() as conn:
        one = submit_run(conn, registry, "pipeline", {"text": "x"}, key="1", namespace="t").run_id
        two = submit_run(conn, registry, "pipeline", {"text": "y"}, key="2", namespace="t").run_id
        assert traces.trace_parents(conn, [one, two]) == {one: None, two: None}
        assert traces.set_missing_trace_parents(conn, {one: FIRST}) == {one}
        assert traces.set_missing_trace_parents(conn, {one: SECOND, two: SECOND}) == {two}
        assert traces.trace_parents(conn, [one, two]) == {one: FIRST, two: SECOND}
        assert traces.set_missing_trace_parents(conn, {}) == set()
