"""The console's search and charts on SQLite (the embedded default): the text search looks in
the same places as on PostgreSQL, and the workflow series takes the portable path (no
percentile_cont: the durations are read and interpolated in Python)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text, update

from sasflow.ops.runs import RunFilter, list_runs
from sasflow.states import RunState
from sasflow.store.db import run_transaction, transaction
from sasflow.store.dialect import capabilities
from sasflow.store.operator import charts
from sasflow.store.schema import runs, steps
from tests.embedded.runs import submit_pipelines


def test_text_search_on_sqlite_finds_the_word_in_any_case(sqlite_engine: Engine) -> None:
    in_output, in_step, plain = submit_pipelines(sqlite_engine, 3, prefix="s-")
    with transaction(sqlite_engine) as conn:
        conn.execute(update(runs).where(runs.c.id == in_output).values(output={"x": "Otter"}))
        conn.execute(
            update(steps)
            .where(steps.c.run_id == in_step, steps.c.name == "b")
            .values(error={"type": "PermanentError", "message": "an OTTER bit the cable"})
        )
    found = run_transaction(sqlite_engine, lambda conn: list_runs(conn, RunFilter(text="otter")))
    assert sorted(int(r["id"]) for r in found) == [in_output, in_step]
    assert plain not in {int(r["id"]) for r in found}


def test_the_workflow_series_on_sqlite_interpolates_its_percentiles(sqlite_engine: Engine) -> None:
    """Three runs ended 30 s ago after 1, 2 and 4 s (one failed): one bucket, p50 2 s,
    p95 3.8 s, as percentile_cont would say."""
    ids = submit_pipelines(sqlite_engine, 3, prefix="c-")
    with transaction(sqlite_engine) as conn:
        for run_id, took, state in zip(
            ids, (1, 2, 4), (RunState.COMPLETED, RunState.ERROR, RunState.COMPLETED), strict=True
        ):
            conn.execute(
                text(
                    "UPDATE runs SET state = :state,"
                    " finished_at = strftime('%Y-%m-%d %H:%M:%f000', 'now', '-30 seconds'),"
                    " created_at = strftime('%Y-%m-%d %H:%M:%f000', 'now', :took)"
                    " WHERE id = :id"
                ),
                {"state": state, "took": f"-{30 + took} seconds", "id": run_id},
            )
    assert not capabilities(sqlite_engine).percentiles
    series = run_transaction(
        sqlite_engine,
        lambda conn: charts.workflow_series(conn, "pipeline", window_s=3600, bucket_s=60),
    )
    filled = [b for b in series.buckets if b.finished]
    assert [(b.finished, b.failed) for b in filled] == [(3, 1)]
    assert filled[0].p50_s == pytest.approx(2.0, abs=0.01)
    assert filled[0].p95_s == pytest.approx(3.8, abs=0.01)
    assert series.buckets.index(filled[0]) == 59
