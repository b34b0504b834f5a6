"""`sasflow alerts list | show | ack` on PostgreSQL."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow.cli.main import cli
from sasflow.store.schema import alerts
from tests.integration.alert_rows import raise_alerts

pytestmark = pytest.mark.integration


@pytest.fixture
def sasflow(database_url: str) -> Any:
    def invoke(*args: str, exit_code: int = 0, **env: str) -> Result:
        result = CliRunner().invoke(
            cli, list(args), env={"SASFLOW_DATABASE_URL": database_url, **env}
        )
        assert result.exit_code == exit_code, result.output
        return result

    return invoke


def test_alerts_list_shows_open_alerts_and_filters(engine: Engine, sasflow: Any) -> None:
    first, second = raise_alerts(engine, 2)
    [stalled] = raise_alerts(engine, 1, kind="stalled")
    sasflow("alerts", "ack", str(first), "--reason", "known")

    open_ids = [a["id"] for a in json.loads(sasflow("alerts", "list", "-o", "json").output)]
    every = [a["id"] for a in json.loads(sasflow("alerts", "list", "--all", "-o", "json").output)]
    kind = [
        a["id"]
        for a in json.loads(sasflow("alerts", "list", "--kind", "stalled", "-o", "json").output)
    ]
    limited = json.loads(sasflow("alerts", "list", "--all", "--limit", "1", "-o", "json").output)
    table = sasflow("alerts", "list").output

    assert (open_ids, every, kind) == ([stalled, second], [stalled, second, first], [stalled])
    assert [a["id"] for a in limited] == [stalled]
    assert "2 open alert(s)" in table
    assert "alert number 1" in table


def test_alerts_show_prints_every_column(engine: Engine, sasflow: Any) -> None:
    [alert_id] = raise_alerts(engine, 1)

    shown = json.loads(sasflow("alerts", "show", str(alert_id), "-o", "json").output)
    table = sasflow("alerts", "show", str(alert_id)).output

    assert set(shown) == set(alerts.c.keys())
    assert (
        shown["id"],
        shown["kind"],
        shown["detail"],
        shown["run_id"],
        shown["acknowledged"],
    ) == (alert_id, "step_failed", {"i": 0}, None, False)
    assert "dedup_key" in table
    assert "step_failed:s0" in table


def test_alerts_ack_records_who_why_and_when(engine: Engine, sasflow: Any) -> None:
    [alert_id] = raise_alerts(engine, 1)

    done = sasflow(
        "alerts", "ack", str(alert_id), "--reason", "on it", LOGNAME="alice", USER="alice"
    )

    with engine.connect() as conn:
        row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).one()
    assert (row.acknowledged, row.acknowledged_by, row.acknowledge_reason) == (
        True,
        f"alice@{socket.gethostname()}",
        "on it",
    )
    assert row.acknowledged_at is not None
    assert f"acknowledged alert {alert_id}" in done.output
    # The same subject and kind may be raised again once acknowledged.
    assert raise_alerts(engine, 1) != []


def test_alerts_ack_twice_or_of_an_unknown_id_is_an_error(engine: Engine, sasflow: Any) -> None:
    [alert_id] = raise_alerts(engine, 1)
    sasflow("alerts", "ack", str(alert_id), "--reason", "first", "--by", "bob")

    again = sasflow("alerts", "ack", str(alert_id), "--reason", "second", exit_code=1)
    unknown = sasflow("alerts", "ack", "999999", "--reason", "x", exit_code=1)
    show_unknown = sasflow("alerts", "show", "999999", exit_code=1)
    no_reason = sasflow("alerts", "ack", str(alert_id), exit_code=2)

    assert f"alert {alert_id} is already acknowledged (by bob" in again.output
    assert "no alert with id 999999" in unknown.output
    assert "no alert with id 999999" in show_unknown.output
    assert "--reason" in no_reason.output
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.acknowledge_reason)).scalar_one() == "first"
