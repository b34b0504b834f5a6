"""What the console's search, workflow charts and bulk cancel read and do on PostgreSQL: text
found in a run's key, input, output, error or a step's error (bounded to the newest runs); a
workflow's finished runs per bucket with p50/p95 from percentile_cont, equal to the portable
path's; a bulk cancel whose dry run changes nothing and whose real run acts on the chosen
runs only."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text, update

from sasflow import submit_run
from sasflow.ops import cancel as cancel_ops
from sasflow.ops import workflows as workflow_ops
from sasflow.ops.runs import RunFilter, list_runs, runs_page
from sasflow.states import RunState
from sasflow.store.db import run_transaction, transaction
from sasflow.store.dialect import capabilities, with_capabilities
from sasflow.store.operator import charts
from sasflow.store.schema import runs, steps
from tests import harness
from tests.apps import basic

pytestmark = pytest.mark.integration


def _submit(engine: Engine, count: int, prefix: str, **run_input: Any) -> list[int]:
    with transaction(engine) as conn:
        return [
            submit_run(
                conn,
                basic.registry,
                "pipeline",
                {"text": f"t{i}", **run_input},
                key=f"{prefix}{i}",
                namespace="t",
            ).run_id
            for i in range(count)
        ]


def _found(engine: Engine, where: RunFilter) -> set[int]:
    return {int(r["id"]) for r in run_transaction(engine, lambda conn: list_runs(conn, where))}


def test_text_search_finds_the_word_in_input_output_errors_and_key(engine: Engine) -> None:
    """Each run holds the word in one place only (any case); the search finds them all and
    no other run; `%` is a character, not a wildcard; the scan bound keeps to the newest."""
    (in_input,) = _submit(engine, 1, "a", note="a Needle here")
    in_output, in_error, in_step, plain = _submit(engine, 4, "b")
    (in_key,) = _submit(engine, 1, "the-NEEDLE-")
    with transaction(engine) as conn:
        conn.execute(
            update(runs).where(runs.c.id == in_output).values(output={"said": "NEEDLE found"})
        )
        conn.execute(
            update(runs).where(runs.c.id == in_error).values(error={"message": "needle broke"})
        )
        conn.execute(
            update(steps)
            .where(steps.c.run_id == in_step, steps.c.name == "b")
            .values(error={"type": "PermanentError", "message": "remote refused: neEdle"})
        )
    everything = {in_input, in_output, in_error, in_step, in_key}
    assert _found(engine, RunFilter(text="needle")) == everything
    assert plain in _found(engine, RunFilter(text="t"))  # every input has "t": a real search
    assert _found(engine, RunFilter(text="%")) == set()
    assert _found(engine, RunFilter(text="needle", text_scan=2)) == {in_key}  # newest 2 ids
    page = run_transaction(
        engine, lambda conn: runs_page(conn, RunFilter(text="needle", limit=2), cursor=None)
    )
    assert [int(r["id"]) for r in page[0]] == [in_key, in_step]
    assert _found(engine, RunFilter(text="needle", states=(RunState.PENDING,))) == everything


def _finish(engine: Engine, run_id: int, *, ago_s: float, took_s: float, state: str) -> None:
    """The run ended `ago_s` seconds ago (database clock) after running `took_s` seconds."""
    with transaction(engine) as conn:
        conn.execute(
            text(
                "UPDATE runs SET state = :state,"
                " finished_at = now() - make_interval(secs => :ago),"
                " created_at = now() - make_interval(secs => :ago + :took) WHERE id = :id"
            ),
            {"state": state, "ago": ago_s, "took": took_s, "id": run_id},
        )


def test_a_workflows_buckets_count_failures_and_percentiles(engine: Engine) -> None:
    """Four runs ended half a minute ago (two failed), two ten minutes ago, one two hours ago
    (outside the hour): the hour's 1-minute buckets say so, p50/p95 as percentile_cont
    interpolates; the portable path (Python's interpolation) gives the same figures."""
    ids = _submit(engine, 7, "c")
    recent = [(1.0, RunState.COMPLETED), (2.0, RunState.ERROR), (3.0, RunState.COMPENSATED)]
    recent.append((4.0, RunState.CANCELLED))
    for run_id, (took, state) in zip(ids, recent, strict=False):
        _finish(engine, run_id, ago_s=30, took_s=took, state=state)
    _finish(engine, ids[4], ago_s=630, took_s=10, state=RunState.COMPLETED)
    _finish(engine, ids[5], ago_s=630, took_s=20, state=RunState.ERROR)
    _finish(engine, ids[6], ago_s=7200, took_s=5, state=RunState.COMPLETED)

    def series(bind: Engine) -> charts.Series:
        return run_transaction(
            bind,
            lambda conn: charts.workflow_series(conn, "pipeline", window_s=3600, bucket_s=60),
        )

    fast = series(engine)
    assert len(fast.buckets) == 60
    filled = {i: b for i, b in enumerate(fast.buckets) if b.finished}
    assert sorted(filled) == [49, 59]
    last, earlier = filled[59], filled[49]
    assert (last.finished, last.failed) == (4, 2)
    assert last.p50_s == pytest.approx(2.5, abs=0.01)
    assert last.p95_s == pytest.approx(3.85, abs=0.01)
    assert (earlier.finished, earlier.failed, earlier.failure_rate) == (2, 1, 0.5)
    assert earlier.p50_s == pytest.approx(15.0)
    assert earlier.p95_s == pytest.approx(19.5)
    assert capabilities(engine).percentiles
    portable = with_capabilities(engine, capabilities(engine).portable())
    slow = series(portable)
    assert [(b.finished, b.failed) for b in slow.buckets] == [
        (b.finished, b.failed) for b in fast.buckets
    ]
    for a, b in zip(slow.buckets, fast.buckets, strict=True):
        for mine, theirs in ((a.p50_s, b.p50_s), (a.p95_s, b.p95_s)):
            assert (mine is None) == (theirs is None)
            if mine is not None and theirs is not None:
                assert mine == pytest.approx(theirs, abs=1e-6)
    totals = run_transaction(engine, lambda conn: workflow_ops.totals(conn, ["fanout", "zzz"]))
    by_name = {t["workflow"]: t for t in totals}
    assert by_name["pipeline"] == {
        "workflow": "pipeline",
        "finished_hour": 6,
        "finished_day": 7,
        "failed_day": 3,
        "failure_rate": 3 / 7,
    }
    assert by_name["zzz"]["failure_rate"] is None  # known to the app, no run: still listed


def test_bulk_cancel_dry_run_changes_nothing_and_the_real_one_only_the_chosen(
    engine: Engine,
) -> None:
    """The preview names the runs and steps the real cancellation stops, and rolls back; the
    real one cancels the chosen pending runs only; a chosen run that ended is left out."""
    first, second, other, ended = _submit(engine, 4, "d")
    _finish(engine, ended, ago_s=1, took_s=1, state=RunState.COMPLETED)
    chosen = RunFilter(ids=(first, second, ended), limit=500)

    def bulk(dry_run: bool) -> list[cancel_ops.Cancelled]:
        return run_transaction(
            engine,
            lambda conn: cancel_ops.cancel_many(
                conn,
                chosen,
                actor="t",
                reason="r",
                namespace="t",
                compensate=False,
                dry_run=dry_run,
            ),
        )

    preview = bulk(dry_run=True)
    assert [(c.run_id, c.state) for c in preview] == [
        (first, RunState.CANCELLED),
        (second, RunState.CANCELLED),
    ]
    assert preview[0].cancelled_steps == ("a", "b")
    states = harness.run_states(engine)
    assert [states[r] for r in (first, second, other)] == [RunState.PENDING] * 3
    assert bulk(dry_run=False) == preview
    states = harness.run_states(engine)
    assert [states[r] for r in (first, second, other, ended)] == [
        RunState.CANCELLED,
        RunState.CANCELLED,
        RunState.PENDING,
        RunState.COMPLETED,
    ]
    only_errors = RunFilter(ids=(other,), states=(RunState.ERROR,))
    assert (
        run_transaction(
            engine,
            lambda conn: cancel_ops.cancel_many(
                conn,
                only_errors,
                actor="t",
                reason="r",
                namespace="t",
                compensate=False,
                dry_run=False,
            ),
        )
        == []
    )
