"""The SQLite state store: same schema and migrations, same statements, claims atomic across
threads under its write lock, times in SQLAlchemy's own text format and read back in UTC."""

from __future__ import annotations

import datetime as dt
import math
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Connection, Engine, func, insert, inspect, select, text, update
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql import ColumnElement

from sasflow import submit_run
from sasflow.cli.main import cli
from sasflow.errors import (
    ConfigurationError,
    ConflictError,
    SchemaOutdatedError,
    StoreUnavailableError,
)
from sasflow.messages import ErrorInfo, Reply
from sasflow.states import StepState
from sasflow.store import migrate, sqlite
from sasflow.store.cluster.lease import Lease
from sasflow.store.db import make_engine, run_transaction, transaction
from sasflow.store.outbox.alerts import Alert, raise_alert
from sasflow.store.runs import queries, sweeps
from sasflow.store.runs.apply import apply_outcomes
from sasflow.store.runs.claim import claim_steps
from sasflow.store.schema import leases, runs, schedulers, steps
from sasflow.store.sqltime import now, plus_seconds
from tests.apps import basic
from tests.embedded.runs import submit_pipelines

SQLALCHEMY_SQLITE_DATETIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}$")


# -- engine and migrations ------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"]
)
def test_in_memory_databases_are_refused_with_the_reason(url: str) -> None:
    with pytest.raises(ConfigurationError, match="in-memory SQLite database"):
        make_engine(url)


def test_a_file_in_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        make_engine(f"sqlite:///{tmp_path}/nowhere/sasflow.db")


def test_connections_use_wal_full_sync_foreign_keys_and_the_busy_timeout(
    sqlite_engine: Engine,
) -> None:
    with sqlite_engine.connect() as conn:
        pragmas = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar_one()
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }
    assert pragmas == {
        "journal_mode": "wal",
        "synchronous": 2,
        "foreign_keys": 1,
        "busy_timeout": int(sqlite.BUSY_TIMEOUT_S * 1000),
    }


def test_every_transaction_takes_the_write_lock_when_it_begins(
    sqlite_engine: Engine,
    sqlite_url: str,
) -> None:
    """Even a transaction that has only read holds the lock: another writer cannot begin."""
    path = sqlite_url.removeprefix("sqlite:///")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with transaction(sqlite_engine) as conn:
            conn.execute(select(func.count()).select_from(runs)).scalar_one()
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")  # released at commit
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_a_lock_held_past_the_busy_timeout_is_a_conflict_and_is_retried(
    sqlite_url: str,
) -> None:
    engine = make_engine(f"{sqlite_url}?timeout=0.1")
    holder = sqlite3.connect(
        sqlite_url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
    )
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(ConflictError, match="database is locked"):
            run_transaction(engine, lambda conn: _submit_many_on(conn, 1, "a"), attempts=1)
        threading.Timer(0.3, holder.execute, args=("COMMIT",)).start()
        created = run_transaction(engine, lambda conn: _submit_many_on(conn, 1, "b"), attempts=10)
        assert len(created) == 1
    finally:
        holder.close()
        engine.dispose()


def _submit_many_on(conn: Connection, count: int, prefix: str) -> list[int]:
    return [
        submit_run(
            conn, basic.registry, "pipeline", {"text": "x"}, key=f"{prefix}{i}", namespace="t"
        ).run_id
        for i in range(count)
    ]


def test_an_unopenable_file_is_store_unavailable_and_a_sql_error_is_not(tmp_path: Path) -> None:
    """A file without the schema is one too (SchemaOutdatedError: waited for until `sasflow db
    upgrade`); SQL the database cannot parse is a bug, raised as it is."""
    folder = tmp_path / "gone"
    folder.mkdir()
    engine = make_engine(f"sqlite:///{folder}/sasflow.db")
    try:
        with (
            pytest.raises(SchemaOutdatedError, match="no such table: runs"),
            transaction(engine) as conn,
        ):
            conn.execute(select(runs.c.id)).all()
        with pytest.raises(OperationalError, match="syntax error"), transaction(engine) as conn:
            conn.execute(text("SELEC 1"))
        engine.dispose()
        shutil.rmtree(folder)
        with (
            pytest.raises(StoreUnavailableError, match="unable to open"),
            transaction(engine) as conn,
        ):
            conn.execute(select(runs.c.id)).all()
    finally:
        engine.dispose()


def test_migrations_upgrade_check_downgrade_and_upgrade_again(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/fresh.db")
    try:
        assert migrate.current(engine) is None
        migrate.upgrade(engine)
        assert migrate.current(engine) == migrate.head()
        assert migrate.differences(engine) == []
        tables = set(inspect(engine).get_table_names())
        assert {"runs", "steps", "events", "alerts", "leases", "schedulers"} <= tables
        migrate.downgrade(engine, "0001")
        assert "leases" not in inspect(engine).get_table_names()
        migrate.downgrade(engine, "base")
        assert set(inspect(engine).get_table_names()) == {"alembic_version"}
        migrate.upgrade(engine)
        assert migrate.differences(engine) == []
        indexes = {i["name"] for i in inspect(engine).get_indexes("steps")}
        assert {"ix_steps_ready", "ix_steps_expiry"} <= indexes
    finally:
        engine.dispose()


def test_cli_db_commands_work_on_a_relative_sqlite_url(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"SASFLOW_DATABASE_URL": "sqlite:///sasflow.db"}
    runner = CliRunner()
    upgraded = runner.invoke(cli, ["db", "upgrade"], env=env)
    checked = runner.invoke(cli, ["db", "check"], env=env)
    current = runner.invoke(cli, ["db", "current"], env=env)
    memory = runner.invoke(cli, ["db", "current"], env={"SASFLOW_DATABASE_URL": "sqlite://"})
    assert (upgraded.exit_code, checked.exit_code, current.exit_code) == (0, 0, 0), (
        upgraded.output,
        checked.output,
    )
    assert f"database at revision {migrate.head()}" in upgraded.output
    assert "schema matches" in checked.output
    assert f"current: {migrate.head()}" in current.output
    assert (tmp_path / "sasflow.db").is_file()
    assert memory.exit_code == 1
    assert "in-memory SQLite database" in memory.output


# -- time -----------------------------------------------------------------------------------


def test_now_and_plus_seconds_are_utc_aware_and_in_sqlalchemys_text_format(
    sqlite_engine: Engine,
) -> None:
    before = dt.datetime.now(dt.UTC)
    with sqlite_engine.connect() as conn:
        row = conn.execute(
            select(
                now().label("now"),
                plus_seconds(now(), 90).label("later"),
                plus_seconds(now(), -0.25).label("earlier"),
            )
        ).one()
        raw = conn.exec_driver_sql(f"SELECT {_sql(now())}").scalar_one()
    after = dt.datetime.now(dt.UTC)
    assert row.now.tzinfo == dt.UTC
    assert before - dt.timedelta(seconds=1) <= row.now <= after + dt.timedelta(seconds=1)
    assert (row.later - row.now).total_seconds() == pytest.approx(90, abs=0.01)
    assert (row.now - row.earlier).total_seconds() == pytest.approx(0.25, abs=0.01)
    assert SQLALCHEMY_SQLITE_DATETIME.match(raw), raw


def _sql(expression: ColumnElement[Any]) -> str:
    return str(
        expression.compile(dialect=sqlite_dialect.dialect(), compile_kwargs={"literal_binds": True})
    )


def test_defaults_and_bound_times_round_trip_as_utc(sqlite_engine: Engine) -> None:
    """A server default, a database-clock update and a bound non-UTC aware time are all stored
    as the same text format and read back as aware UTC datetimes of the same instant."""
    paris = dt.datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    with transaction(sqlite_engine) as conn:
        conn.execute(insert(schedulers).values(id="s1", hostname="h", pid=1))
        conn.execute(update(schedulers).values(heartbeat_at=paris))
        conn.execute(update(schedulers).values(started_at=plus_seconds(now(), 5)))
        row = conn.execute(select(schedulers)).one()
        raw = conn.exec_driver_sql("SELECT started_at, heartbeat_at FROM schedulers").one()
    assert row.heartbeat_at == paris
    assert row.heartbeat_at.tzinfo == dt.UTC
    assert row.heartbeat_at.hour == 11
    assert row.started_at.tzinfo == dt.UTC
    assert all(SQLALCHEMY_SQLITE_DATETIME.match(value) for value in raw), raw


@pytest.mark.parametrize("size", [0, 1, 700])
def test_id_lists_are_an_expanding_in_of_any_length(sqlite_engine: Engine, size: int) -> None:
    """SQLite has no arrays: queries.one_of is an IN list there (ANY on PostgreSQL)."""
    run_ids = submit_pipelines(sqlite_engine, 3)
    wanted = [*run_ids[:2], *range(10**9, 10**9 + size - 2)] if size >= 2 else run_ids[:size]
    with transaction(sqlite_engine) as conn:
        statement = queries.lock_runs(skip_locked=False)
        found = conn.execute(statement, {"b_run_ids": wanted}).scalars().all()
    assert " IN " in str(statement.compile(dialect=sqlite_dialect.dialect()))
    assert found == sorted(r for r in run_ids if r in wanted)


def test_the_power_fallback_matches_sqlites_math_functions() -> None:
    assert sqlite.power(2.0, 10.0) == 1024.0
    assert sqlite.power(10.0, 400.0) == math.inf
    assert sqlite.power(None, 2.0) is None
    assert sqlite.power(-8.0, 0.5) is None


# -- claims, submissions, replies, sweeps, leases, alerts ------------------------------------


def test_submitting_the_same_key_from_four_threads_creates_one_run(sqlite_engine: Engine) -> None:
    barrier = threading.Barrier(4)
    created: list[bool] = []
    run_ids: set[int] = set()
    lock = threading.Lock()

    def submitter() -> None:
        barrier.wait()
        result = run_transaction(
            sqlite_engine,
            lambda conn: submit_run(
                conn, basic.registry, "pipeline", {"text": "x"}, key="same", namespace="t"
            ),
        )
        with lock:
            created.append(result.created)
            run_ids.add(result.run_id)

    threads = [threading.Thread(target=submitter) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(created) == [False, False, False, True]
    assert len(run_ids) == 1
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 1
        assert conn.execute(select(func.count()).select_from(steps)).scalar_one() == 2


def test_replies_are_fenced_by_attempt(sqlite_engine: Engine) -> None:
    """A reply of an older attempt and a duplicate are dropped; the current one advances: step
    b, whose input has a builder of its own, is left to a scheduler's advance duty (its user
    code never runs in the store's transaction)."""
    (run_id,) = submit_pipelines(sqlite_engine, 1)
    with transaction(sqlite_engine) as conn:
        (step,) = claim_steps(conn, locked_by="s1", batch=1)
        conn.execute(
            update(steps)
            .where(steps.c.id == step.id)
            .values(state=StepState.PENDING, locked_by=None, complete_by=None)
        )
        (again,) = claim_steps(conn, locked_by="s2", batch=1)
    assert (again.id, again.attempt) == (step.id, 2)

    def apply(reply: Reply) -> int:
        with transaction(sqlite_engine) as conn:
            return apply_outcomes(
                conn, basic.registry, [reply.outcome()], namespace="t", actor="test"
            ).applied

    assert apply(Reply(step_id=step.id, attempt=1, status="ok", output={"text": "LATE"})) == 0
    current = Reply(step_id=step.id, attempt=2, status="ok", output={"text": "X"})
    assert apply(current) == 1
    assert apply(current) == 0
    assert (
        apply(
            Reply(
                step_id=step.id,
                attempt=2,
                status="error",
                error=ErrorInfo(type="Boom", message="late"),
            )
        )
        == 0
    )
    with sqlite_engine.connect() as conn:
        rows = {r.name: r for r in conn.execute(select(steps).where(steps.c.run_id == run_id))}
    assert (rows["a"].state, rows["a"].output) == (StepState.PROCESSED, {"text": "X"})
    assert (rows["b"].state, rows["b"].input) == (StepState.WAITING, None)
    with sqlite_engine.connect() as conn:
        marked = conn.execute(select(runs.c.advance_due).where(runs.c.id == run_id)).scalar_one()
    assert marked is not None


def test_two_concurrent_sweepers_count_each_expired_step_exactly_once(
    sqlite_engine: Engine,
) -> None:
    """Both sweepers believe they lead; the write lock serialises their batches. Each failure
    backs the step off by min(maximum, initial * multiplier**failures) on the database clock
    (least() and power() in their SQLite forms): 1 s doubling, capped at 300 s."""
    submit_pipelines(sqlite_engine, 300)
    with transaction(sqlite_engine) as conn:
        conn.execute(
            update(steps)
            .where(steps.c.name == "a")
            .values(
                state=StepState.PROCESSING,
                attempt=1,
                locked_by="gone",
                max_failures=20,
                failure_count=steps.c.id % 10,
                started_at=plus_seconds(now(), -120),
                complete_by=plus_seconds(now(), -60),
            )
        )
        earlier = dict(
            conn.execute(select(steps.c.id, steps.c.failure_count).where(steps.c.name == "a")).all()
        )
    swept: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def one_batch(conn: Connection) -> list[int]:
        candidates = sorted(set(conn.execute(queries.expired_runs(), {"b_batch": 20}).scalars()))
        if not candidates:
            return []
        locked = (
            conn.execute(queries.lock_runs(skip_locked=True), {"b_run_ids": candidates})
            .scalars()
            .all()
        )
        expired = [r.id for r in sweeps.take_expired(conn, locked)]
        return [r.id for r in sweeps.count_failures(conn, expired, error=None)]

    def sweeper() -> None:
        barrier.wait()
        while batch := run_transaction(sqlite_engine, one_batch):
            with lock:
                swept.extend(batch)

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(swept) == sorted(earlier)
    with sqlite_engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.id, steps.c.failure_count, steps.c.state, steps.c.not_before).where(
                steps.c.id.in_(earlier)
            )
        ).all()
        db_now = conn.execute(select(now())).scalar_one()
    assert {r.id: r.failure_count for r in rows} == {i: n + 1 for i, n in earlier.items()}
    assert {r.state for r in rows} == {StepState.PENDING}
    for row in rows:
        expected = min(300.0, 2.0 ** earlier[row.id])
        assert (row.not_before - db_now).total_seconds() == pytest.approx(expected, abs=2), row


def test_a_lease_is_held_by_one_holder_until_it_expires(sqlite_engine: Engine) -> None:
    first, second = Lease("first", name="role", ttl=0.3), Lease("second", name="role", ttl=0.3)
    assert first.acquire(sqlite_engine)
    assert not second.acquire(sqlite_engine)
    assert first.acquire(sqlite_engine)  # renewal
    time.sleep(0.5)
    assert second.acquire(sqlite_engine)
    assert second.token == 2
    with sqlite_engine.connect() as conn:
        assert conn.execute(select(leases.c.holder, leases.c.token)).one() == ("second", 2)


def test_leases_of_different_roles_are_independent_and_release_frees_one(
    sqlite_engine: Engine,
) -> None:
    one, other = Lease("a", name="one", ttl=60), Lease("a", name="other", ttl=60)
    assert one.acquire(sqlite_engine)
    assert other.acquire(sqlite_engine)  # same holder, another role: its own row
    one.release(sqlite_engine)
    assert one.token is None
    taker = Lease("b", name="one", ttl=60)
    assert taker.acquire(sqlite_engine)  # released: no need to wait for the TTL
    assert taker.token == 2
    assert not Lease("b", name="other", ttl=60).acquire(sqlite_engine)


def test_an_open_alert_is_raised_once(sqlite_engine: Engine) -> None:
    (run_id,) = submit_pipelines(sqlite_engine, 1)
    alert = Alert(kind="step_failed", subject="1", message="boom", run_id=run_id)
    with transaction(sqlite_engine) as conn:
        first = raise_alert(conn, alert)
        duplicate = raise_alert(conn, alert)
    assert first is not None
    assert duplicate is None


def test_the_relay_reads_unpublished_events_through_their_partial_index(
    sqlite_engine: Engine,
) -> None:
    """On SQLite `published IS 0` would scan every event ever recorded: the relay's predicate is
    written `NOT published`, the index's own, there."""
    statement = queries.unpublished_events().compile(dialect=sqlite_engine.dialect)
    params = statement.construct_params({"b_limit": 10})
    args = tuple(params[name] for name in statement.positiontup or ())
    with sqlite_engine.connect() as conn:
        plan = [row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", args)]
    assert "SCAN events USING INDEX ix_events_unpublished" in plan


def test_bulk_dry_run_rolls_back_on_sqlite_and_names_what_the_real_run_does(
    sqlite_engine: Engine,
) -> None:
    """The dry run of a bulk resubmission (a savepoint rolled back) leaves the runs as they
    were and lists the same runs and steps the real one then resubmits; the filter's free
    text on the key works on SQLite too."""
    from sasflow.ops import cancel, resubmit  # noqa: PLC0415 - the ops under test
    from sasflow.ops.runs import RunFilter  # noqa: PLC0415

    ids = submit_pipelines(sqlite_engine, 3, prefix="bulk-Key-")
    with transaction(sqlite_engine) as conn:
        for run_id in ids[:2]:
            cancel.cancel(conn, run_id, actor="t", reason="r", namespace="t")
    where = RunFilter(states=("cancelled",), key_contains="KEY-")

    def bulk(dry_run: bool) -> list[resubmit.Resubmitted]:
        return run_transaction(
            sqlite_engine,
            lambda conn: resubmit.resubmit_many(
                conn, basic.registry, where, actor="t", reason="r", dry_run=dry_run, namespace="t"
            ),
        )

    preview = bulk(dry_run=True)
    assert [(p.run_id, p.reset_steps) for p in preview] == [(i, ("a", "b")) for i in ids[:2]]
    with sqlite_engine.connect() as conn:
        found = conn.execute(select(runs.c.id, runs.c.state).where(runs.c.id.in_(ids)))
        states = {row.id: row.state for row in found}
    assert states == {ids[0]: "cancelled", ids[1]: "cancelled", ids[2]: "pending"}
    assert bulk(dry_run=False) == preview
    with sqlite_engine.connect() as conn:
        after = set(conn.execute(select(runs.c.state).where(runs.c.id.in_(ids[:2]))).scalars())
    assert after == {"running"}
