"""A database that rejects writes for a while (a standby after failover, a disk-full guard,
`default_transaction_read_only`) is an outage: the roles hold what they received, back off and
retry; nothing is dead-lettered and no role exits.

The window is 8 s, not the 30 s of the report: every role's backoff reaches its 5 s ceiling
within it, so a longer window only repeats the same attempts."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url

from sasflow.store.listen import libpq_dsn
from sasflow.store.schema import runs, steps
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness, services
from tests.apps import basic

pytestmark = pytest.mark.integration

WINDOW_S = 8.0


def _terminate_sessions(admin: psycopg.Connection[tuple[object, ...]], database: str) -> None:
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()",
        (database,),
    )


@contextlib.contextmanager
def read_only(database_url: str) -> Iterator[None]:
    """This test's own database refuses writes until the block ends: new sessions start
    read-only, and the sessions open now are ended so that none keeps writing."""
    database = make_url(database_url).database or ""
    name = sql.Identifier(database)
    with psycopg.connect(libpq_dsn(services.admin_url()), autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(name)
        )
        _terminate_sessions(admin, database)
        try:
            yield
        finally:
            admin.execute(
                sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(name)
            )
            # Sessions opened meanwhile stay read-only: end them too, as a promotion would.
            _terminate_sessions(admin, database)


def _count(engine: Engine, query: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())  # type: ignore[call-overload]


def _dead_letter_count(names: Names) -> int:
    with services.broker_channel() as channel:
        declared = channel.queue_declare(names.dead_letter_queue, passive=True)
    return int(declared.method.message_count or 0)


def _submit(names: Names, workflow: str, key: str, run_input: dict[str, object]) -> None:
    body = {"workflow": workflow, "key": key, "input": run_input}
    harness.publish_raw(names.submit, json.dumps(body).encode())


def test_submissions_replies_and_sweeps_wait_out_a_read_only_database(
    engine: Engine, database_url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """Runs submitted before the window have replies arriving during it (the scheduler holds
    them); submissions arriving during it are held by the submitter; the supervisor keeps
    sweeping. Once writable, every run completes, with no dead letter and no role exiting."""
    caplog.set_level(logging.WARNING)
    submitter = harness.submitter(engine, basic.registry, names)
    scheduler = harness.scheduler(engine, database_url, basic.registry, names)
    agent = harness.agent(basic.echo, names, concurrency=8)
    supervisor = Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(interval=0.5),
    )
    try:
        with harness.running(submitter, scheduler, agent, supervisor):
            harness.wait_for(lambda: services.queue_exists(names.submit), what="submit queue")
            for i in range(5):  # their first step replies ~1.5 s into the window
                _submit(names, "sleepy", f"before-{i}", {"delay": 1.5})
            harness.wait_for(
                lambda: (
                    _count(
                        engine,
                        select(func.count())
                        .select_from(steps)
                        .where(steps.c.state == "processing"),
                    )
                    == 5
                ),
                what="the first steps of the runs submitted before the window dispatched",
            )
            with read_only(database_url):
                for i in range(5):
                    _submit(names, "pipeline", f"during-{i}", {"text": f"t{i}"})
                time.sleep(WINDOW_S)
                assert _dead_letter_count(names) == 0
                assert _count(engine, select(func.count()).select_from(runs)) == 5
            harness.wait_for(
                harness.all_runs_in(engine, {"completed"}, 10),
                timeout=30,
                what="all ten runs completed after the window",
            )
            assert _dead_letter_count(names) == 0
    finally:
        supervisor.close()
    assert (submitter.stats.created, submitter.stats.dead_lettered) == (10, 0)
    assert scheduler.stats.dead_lettered == 0
    # An outage is warned about; an ERROR here is a role treating it as a bug (it used to be
    # "applying N replies failed", "sweep failed", with a traceback).
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    outage = [r for r in caplog.records if "read-only transaction" in r.getMessage()]
    assert {r.name.split(".")[1] for r in outage} >= {"runtime", "scheduler"}
