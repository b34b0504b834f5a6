"""examples/media: a fan-out/fan-in DAG, served by `sasflow run` (every role in one process)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.store.schema import events, runs, steps
from sasflow.transport.topology import Names
from tests import harness
from tests.acceptance.processes import processes

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

TRANSCODES = ("transcode-1080p", "transcode-720p", "transcode-audio")
JOBS = 2


def _first_event(engine: Engine, run_id: int, step: str, to_state: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(events.c.created_at)
            .where(events.c.run_id == run_id, events.c.step == step, events.c.to_state == to_state)
            .order_by(events.c.id)
            .limit(1)
        ).scalar_one()


def test_media_transcodes_run_in_parallel_and_publish_runs_after_all_of_them(
    tmp_path: Path, engine: Engine, database_url: str, names: Names
) -> None:
    """On PostgreSQL and RabbitMQ: the three transcodes of a job overlap in time on the
    agent's threads; `package` and `publish` start only after every transcode was processed
    (database clock); `sasflow run` stops cleanly on SIGTERM."""
    _run_media_jobs(tmp_path, engine, database_url, names.namespace, broker_url=None)


def test_media_under_sasflow_run_on_sqlite_and_the_in_process_bus(tmp_path: Path) -> None:
    """The same on the embedded default: a SQLite file, and memory:// between the threads of
    `sasflow run` (the submissions are written to the file by `sasflow submit`)."""
    database_url = f"sqlite:///{tmp_path / 'media.db'}"
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        _run_media_jobs(tmp_path, engine, database_url, "media", broker_url="memory://")
    finally:
        engine.dispose()


def _run_media_jobs(
    tmp_path: Path, engine: Engine, database_url: str, namespace: str, *, broker_url: str | None
) -> None:
    with processes(tmp_path, database_url=database_url, namespace=namespace) as procs:
        procs.env["SASFLOW_APP"] = "examples.media.app"
        if broker_url is not None:
            procs.env["SASFLOW_BROKER_URL"] = broker_url
        procs.start("run", "run", "--concurrency", "4", "--supervisor-interval", "1")
        run_ids = []
        for job in range(JOBS):
            submitted = procs.run(
                "submit",
                "media",
                "--key",
                f"job-{job}",
                "--input",
                json.dumps({"source": f"uploads/talk-{job}.mov"}),
            )
            assert submitted.returncode == 0, submitted.stderr
            run_ids.append(json.loads(submitted.stdout)["run_id"])
        harness.wait_for(
            harness.all_runs_in(engine, {"completed"}, JOBS),
            timeout=60,
            interval=0.1,
            what="media jobs completed",
        )
        procs.assert_alive()
        procs.signal("run", signal.SIGTERM)
        assert procs.wait("run") == 0, procs.log("run")

    for run_id in run_ids:
        outputs = {row.name: row.output for row in harness.step_rows(engine, run_id)}
        transcodes = [outputs[name] for name in TRANSCODES]
        # Each interval overlaps the others: the last to start began before the first ended.
        assert max(t["started"] for t in transcodes) < min(t["finished"] for t in transcodes)
        assert len({t["worker"] for t in transcodes}) == len(TRANSCODES)
        assert outputs["package"]["files"] == [t["file"] for t in transcodes]

        processed = [_first_event(engine, run_id, name, "processed") for name in TRANSCODES]
        assert _first_event(engine, run_id, "package", "processing") >= max(processed)
        assert _first_event(engine, run_id, "publish", "processing") > _first_event(
            engine, run_id, "package", "processed"
        )
        with engine.connect() as conn:
            run = conn.execute(select(runs).where(runs.c.id == run_id)).one()
            waited = (
                conn.execute(select(steps.c.attempt).where(steps.c.run_id == run_id))
                .scalars()
                .all()
            )
        assert run.output["url"].endswith(f"job-{run_ids.index(run_id)}/master.m3u8")
        assert set(waited) == {1}  # no step needed a second attempt
