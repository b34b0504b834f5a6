"""The audit trail on PostgreSQL: `sasflow audit list` reads it (since, actor, action, JSON) and
the supervisor's retention deletes the records past SASFLOW_RETAIN_AUDIT_DAYS, recording that
it did."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select, text, update

from sasflow.cli.main import cli
from sasflow.ops.retention import AUDIT_PRUNE_ACTION, GrowthRetention, prune_audit
from sasflow.store.operator import audit as audit_store
from sasflow.store.schema import audit
from sasflow.supervisor.service import Supervisor, SupervisorOptions
from sasflow.transport.topology import Names
from tests import harness, services

pytestmark = pytest.mark.integration

DAY = 86400.0


def _record(engine: Engine, actor: str, action: str, days_ago: float, **detail: Any) -> int:
    """An audit record written `days_ago` days ago by the database's clock."""
    with engine.begin() as conn:
        record_id = audit_store.record(
            conn, audit_store.AuditRecord(actor, action, f"{action} by {actor}", detail=detail)
        )
        when = func.now() - text(f"interval '{days_ago * DAY} seconds'")
        conn.execute(
            update(audit).where(audit.c.id == record_id).values(created_at=when, updated_at=when)
        )
    return record_id


@pytest.fixture
def trail(engine: Engine) -> dict[str, int]:
    return {
        "old_purge": _record(engine, "alice@ops", "dead.purge", 400, count=3, dead_letters=[1]),
        "old_token": _record(engine, "bob@ops", "tokens.create", 380),
        "replay": _record(engine, "alice@ops", "dead.replay", 20, count=1),
        "drain": _record(engine, "bob@ops", "schedulers.drain", 2),
        "limit": _record(engine, "alice@ops", "limits.set", 0.01),
    }


def _ids(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(select(audit.c.id)).scalars())


def _env(database_url: str, names: Names, **extra: str) -> dict[str, str]:
    return {
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_BROKER_URL": services.broker_url(),
        "SASFLOW_NAMESPACE": names.namespace,
        **extra,
    }


def test_audit_list_filters_by_since_actor_and_action(
    database_url: str, names: Names, trail: dict[str, int]
) -> None:
    runner = CliRunner()

    def listed(*args: str) -> list[int]:
        done = runner.invoke(
            cli, ["audit", "list", *args, "-o", "json"], env=_env(database_url, names)
        )
        assert done.exit_code == 0, done.output
        return [r["id"] for r in json.loads(done.output)]

    newest_first = [trail[k] for k in ("limit", "drain", "replay", "old_token", "old_purge")]
    assert listed() == newest_first
    assert listed("--since", "3d") == [trail["limit"], trail["drain"]]
    assert listed("--actor", "alice@ops") == [trail["limit"], trail["replay"], trail["old_purge"]]
    assert listed("--action", "dead") == [trail["replay"], trail["old_purge"]]
    assert listed("--action", "dead.purge") == [trail["old_purge"]]
    assert listed("--action", "dead", "--since", "30d") == [trail["replay"]]
    assert listed("--limit", "2") == newest_first[:2]
    assert listed("--action", "nothing.like.this") == []

    table = runner.invoke(cli, ["audit", "list", "--since", "3d"], env=_env(database_url, names))
    assert table.exit_code == 0, table.output
    assert "2 audit record(s)" in table.output
    assert "schedulers.drain" in table.output
    assert "dead.purge" not in table.output

    bad = runner.invoke(
        cli, ["audit", "list", "--since", "yesterday"], env=_env(database_url, names)
    )
    assert bad.exit_code == 2
    assert "neither a duration like 15m/2h/3d nor an ISO-8601 time" in bad.output


def test_prune_audit_deletes_past_the_retention_in_batches_and_records_it(
    engine: Engine, trail: dict[str, int]
) -> None:
    done = prune_audit(engine, 365 * DAY, actor="test", batch=1)
    assert (done.pruned, done.batches, done.complete) == (2, 2, True)
    kept = _ids(engine)
    assert trail["old_purge"] not in kept
    assert trail["old_token"] not in kept
    assert {trail["replay"], trail["drain"], trail["limit"]} <= kept
    with engine.connect() as conn:
        (row,) = conn.execute(select(audit).where(audit.c.action == AUDIT_PRUNE_ACTION)).all()
    assert (row.actor, row.reason) == ("test", "retention")
    assert row.detail == {"pruned": 2, "batches": 2, "keep_days": 365.0}
    again = prune_audit(engine, 365 * DAY, actor="test")
    assert again.pruned == 0


def test_the_supervisor_enforces_the_audit_retention(
    engine: Engine, names: Names, trail: dict[str, int]
) -> None:
    role = Supervisor(
        engine,
        names,
        transport=harness.transport("supervisor"),
        options=SupervisorOptions(growth=GrowthRetention(audit_keep_s=10 * DAY)),
    )
    try:
        report = role.sweep_once()
    finally:
        role.close()
    assert report is not None
    assert report.audit_pruned == 3
    assert "audit_pruned=3" in report.summary()
    kept = _ids(engine) - {trail["drain"], trail["limit"]}
    with engine.connect() as conn:
        actions = conn.execute(select(audit.c.action).where(audit.c.id.in_(kept))).scalars().all()
    assert actions == [AUDIT_PRUNE_ACTION]


def test_supervisor_once_takes_the_audit_retention_from_the_settings(
    database_url: str, engine: Engine, names: Names, trail: dict[str, int]
) -> None:
    env = _env(database_url, names, SASFLOW_RETAIN_AUDIT_DAYS="30")
    done = CliRunner().invoke(cli, ["supervisor", "--once"], env=env)
    assert done.exit_code == 0, done.output
    assert "audit_pruned=2" in done.output
    assert {trail["replay"], trail["drain"], trail["limit"]} <= _ids(engine)
    forever = CliRunner().invoke(
        cli, ["supervisor", "--once"], env={**env, "SASFLOW_RETAIN_AUDIT_DAYS": "0"}
    )
    assert forever.exit_code == 0, forever.output
    assert "audit_pruned" not in forever.output
    assert trail["replay"] in _ids(engine)
