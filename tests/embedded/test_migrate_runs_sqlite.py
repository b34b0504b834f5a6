"""`sasflow runs migrate` on the embedded default (SQLite): the same statements move a run
that has not started to the new graph (tests/integration/test_migrate_runs.py has PostgreSQL,
a run in flight and a real scheduler and agent)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import select

from sasflow.cli.main import cli
from sasflow.commands import NewRun
from sasflow.store import migrate
from sasflow.store.db import make_engine, transaction
from sasflow.store.runs.submit import submit
from sasflow.store.schema import runs, steps
from tests.apps import migrating


def test_a_run_not_started_takes_the_new_graph(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sasflow.db"
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        with transaction(engine) as conn:
            new = NewRun(workflow="order", key="k", input={"item": "pen"}, version=1)
            run_id = submit(conn, migrating.registry, new, namespace="t", actor="t").run_id
            keys = {r.name: r.idempotency_key for r in conn.execute(select(steps))}
        env = {"SASFLOW_DATABASE_URL": url, "SASFLOW_APP": "tests.apps.migrating"}
        args = ["runs", "migrate", "--workflow", "order", "--from-version", "1"]
        args += ["--to-version", "2", "--map", "charge=pay", "--reason", "r", "--yes"]
        result = CliRunner().invoke(cli, args, env=env)
        assert result.exit_code == 0, result.output
        with engine.connect() as conn:
            rows = conn.execute(
                select(steps.c.name, steps.c.state, steps.c.idempotency_key, steps.c.input)
            ).all()
            version = conn.execute(select(runs.c.version).where(runs.c.id == run_id)).scalar()
    finally:
        engine.dispose()
    found = {r.name: (r.state, r.idempotency_key) for r in rows}
    assert found == {
        "reserve": ("pending", keys["reserve"]),
        "pay": ("waiting", keys["charge"]),
        "ship": ("waiting", found["ship"][1]),
    }
    assert found["ship"][1] not in keys.values()
    assert {r.name: r.input for r in rows}["reserve"] == {"item": "pen"}
    assert version == 2
