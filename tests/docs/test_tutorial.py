"""The tutorial and the README's quickstart, executed command by command as a reader would,
on the real PostgreSQL and RabbitMQ.

The pages' own blocks (marked `<!-- doc-run: ... -->`) are read and run in order; only the
database, broker URL and namespace they export are replaced by the test's own, so the test
neither needs nor touches the `sasflow_tutorial` database or the `tutorial` namespace. After each
block, a check waits for and asserts what the page says happens next.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url

from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.store.schema import alerts, events, steps
from sasflow.transport.topology import Names
from tests import harness, services
from tests.docs.markdown import REPO, doc_run_blocks
from tests.docs.shell import DocShell

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

Results = list[subprocess.CompletedProcess[str] | None]


@dataclass
class Session:
    shell: DocShell
    database_url: str
    _engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = make_engine(self.database_url, application_name="sasflow-doc-test")
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()

    def wait_run(self, run_id: int, state: str, timeout: float = 30) -> None:
        harness.wait_for(
            lambda: harness.run_states(self.engine).get(run_id) == state,
            timeout=timeout,
            interval=0.2,
            what=f"run {run_id} {state}",
        )

    def step(self, run_id: int, name: str) -> object:
        return next(s for s in harness.step_rows(self.engine, run_id) if s.name == name)

    def log(self, name: str) -> str:
        path = self.shell.cwd / name
        return path.read_text(errors="replace") if path.exists() else ""


def _out(results: Results, index: int) -> str:
    result = results[index]
    assert result is not None
    return result.stdout


def _submitted(results: Results, run_id: int, key: str) -> None:
    line = next(r for r in results if r is not None and r.args[3:4] == ["submit"])
    assert json.loads(line.stdout) == {
        "run_id": run_id,
        "workflow": "signup",
        "key": key,
        "created": True,
        "state": "pending",
    }


def _setup(s: Session, results: Results) -> None:
    assert s.shell.exported["SASFLOW_APP"] == "examples.tutorial.app"
    assert s.shell.env["SASFLOW_APP"] == "examples.tutorial.app"
    assert _out(results, -1).strip() == f"database at revision {migrate.head()}"


def _start(s: Session, results: Results) -> None:
    harness.wait_for(
        lambda: "consuming" in s.log("mailer.log") and "consuming" in s.log("accounts.log"),
        timeout=30,
        interval=0.2,
        what="both agents consume",
    )
    s.shell.assert_jobs_alive()


def _submit(s: Session, results: Results) -> None:
    _submitted(results, 1, "signup-ada")
    s.wait_run(1, "completed")


def _inspect(s: Session, results: Results) -> None:
    assert "completed" in _out(results, 0)
    assert "signup-ada" in _out(results, 1)


def _outage(s: Session, results: Results) -> None:
    _submitted(results, 2, "signup-grace")
    # "after a few seconds": the first attempt expired and the supervisor counted it.
    harness.wait_for(
        lambda: s.step(2, "welcome").failure_count >= 1,  # type: ignore[attr-defined]
        timeout=20,
        interval=0.2,
        what="the supervisor reclaims the silent step",
    )


def _watch(s: Session, results: Results) -> None:
    assert "expired" in _out(results, 0)


def _recover(s: Session, results: Results) -> None:
    s.wait_run(2, "completed", timeout=20)
    welcome = s.step(2, "welcome")
    assert welcome.state == "processed"  # type: ignore[attr-defined]
    assert welcome.attempt >= 2  # type: ignore[attr-defined]
    with s.engine.connect() as conn:
        expiries = (
            conn.execute(
                select(events.c.actor).where(events.c.run_id == 2, events.c.reason == "expired")
            )
            .scalars()
            .all()
        )
    assert expiries, "no expiry recorded"
    assert all(actor.startswith("supervisor:") for actor in expiries)


def _recovered(s: Session, results: Results) -> None:
    assert "completed" in _out(results, 0)


def _fail(s: Session, results: Results) -> None:
    _submitted(results, 3, "signup-linus")
    s.wait_run(3, "error", timeout=45)
    welcome = s.step(3, "welcome")
    assert (welcome.state, welcome.failure_count) == ("error", 3)  # type: ignore[attr-defined]
    # The alert is delivered by the supervisor's dispatcher shortly after it is raised.
    harness.wait_for(
        lambda: "step_failed" in s.log("supervisor.log"),
        timeout=10,
        interval=0.2,
        what="the log sink writes the alert",
    )


def _alert(s: Session, results: Results) -> None:
    assert "error" in _out(results, 0)
    assert "step_failed" in _out(results, 1)
    assert "signup-linus" in _out(results, 2)


def _resubmit(s: Session, results: Results) -> None:
    assert _out(results, 1).strip() == "resubmitted run 3: reset welcome; ready welcome"
    s.wait_run(3, "completed", timeout=20)


def _done(s: Session, results: Results) -> None:
    assert "completed" in _out(results, 0)
    assert "step_failed" in _out(results, 1)
    with s.engine.connect() as conn:
        rows = conn.execute(
            select(alerts.c.kind, alerts.c.acknowledged).order_by(alerts.c.id)
        ).all()
    # The resubmission closed the alert's incident: its notice is a row of the outbox too.
    assert [(r.kind, r.acknowledged) for r in rows] == [
        ("step_failed", True),
        ("incident_resolved", True),
    ]


def _stop(s: Session, results: Results) -> None:
    assert s.shell.stopped, "no background job was stopped"
    assert set(s.shell.stopped.values()) == {0}, s.shell.stopped


TUTORIAL_CHECKS: dict[str, Callable[[Session, Results], None]] = {
    "setup": _setup,
    "start": _start,
    "submit": _submit,
    "inspect": _inspect,
    "outage": _outage,
    "watch": _watch,
    "recover": _recover,
    "recovered": _recovered,
    "fail": _fail,
    "alert": _alert,
    "resubmit": _resubmit,
    "done": _done,
    "stop": _stop,
}


def _createdb_for(database: str) -> Callable[[list[str]], list[str]]:
    """The page's `createdb -h localhost -U postgres NAME`, aimed at the test's server and
    database instead."""

    def rewrite(argv: list[str]) -> list[str]:
        assert argv[:-1] == ["createdb", "-h", "localhost", "-U", "postgres"], argv
        url = make_url(services.admin_url())
        return [
            "createdb",
            "-h",
            url.host or "localhost",
            "-p",
            str(url.port or 5432),
            "-U",
            url.username or "postgres",
            database,
        ]

    return rewrite


@pytest.fixture
def own_database() -> Iterator[str]:
    """A name for the database the page's `createdb` creates; dropped afterwards."""
    name = services.unique("sasflow_doc")
    yield name
    services.drop_database(name)


@pytest.fixture
def session(tmp_path: Path, names: Names, own_database: str) -> Iterator[Session]:
    database_url = services.database_url(own_database)
    # The test's own services and namespace, whether the page exports these names or not.
    own = {
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_BROKER_URL": services.broker_url(),
        "SASFLOW_NAMESPACE": names.namespace,
    }
    shell = DocShell(
        cwd=tmp_path,
        env={
            **os.environ,
            **own,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
        },
        overrides=own,
        rewrites={"createdb": _createdb_for(own_database)},
    )
    s = Session(shell, database_url)
    try:
        yield s
    finally:
        shell.stop_all()
        s.close()


def test_tutorial_runs_as_written(session: Session) -> None:
    """Every block of docs/tutorial.md marked for execution runs, in order, and does what the
    page says: a completed run, a silent step recovered by the supervisor, a run failed with an
    alert, then resubmitted and completed."""
    blocks = doc_run_blocks("docs/tutorial.md", "tutorial")
    assert [b.step for b in blocks] == list(TUTORIAL_CHECKS)
    for block in blocks:
        results = [session.shell.run(line) for line in block.lines]
        TUTORIAL_CHECKS[block.step](session, results)


def test_readme_quickstart_runs_as_written(session: Session) -> None:
    """The README's quickstart commands start every process and the submitted order
    completes."""
    (block,) = doc_run_blocks("README.md", "readme-quickstart")
    results = [session.shell.run(line) for line in block.lines]
    submitted = next(r for r in results if r is not None and r.args[3:4] == ["submit"])
    run_id = json.loads(submitted.stdout)["run_id"]
    session.wait_run(run_id, "completed")
    with session.engine.connect() as conn:
        states = conn.execute(select(steps.c.name, steps.c.state).order_by(steps.c.id)).all()
    assert [(r.name, r.state) for r in states] == [
        ("reserve", "processed"),
        ("charge", "processed"),
    ]
    session.shell.assert_jobs_alive()
    session.shell.stop_all()
    assert set(session.shell.stopped.values()) == {0}, session.shell.stopped
