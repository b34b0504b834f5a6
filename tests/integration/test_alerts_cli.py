"""`sasflow alerts list | show | ack` on PostgreSQL."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select, update

from sasflow.cli.main import cli
from sasflow.store.outbox.alerts import Delivery, record_deliveries
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
        # (the kind: acknowledging its one alert resolved its incident, with a notice)
        assert (
            conn.execute(
                select(alerts.c.acknowledge_reason).where(alerts.c.kind == "step_failed")
            ).scalar_one()
            == "first"
        )


def test_alerts_list_undelivered_shows_what_a_sink_failed_to_take(
    engine: Engine, sasflow: Any
) -> None:
    """One alert every sink took, one whose webhook fails (retried later), one given up a
    day after it was raised and acknowledged meanwhile: --undelivered lists the last two,
    whatever their state, with each failing sink's error and when it is tried again."""
    taken, retried, given_up = raise_alerts(engine, 3)
    with engine.begin() as conn:
        conn.execute(
            update(alerts)
            .where(alerts.c.id == given_up)
            .values(created_at=alerts.c.created_at - timedelta(days=1, seconds=1))
        )
        record_deliveries(
            conn,
            [
                Delivery(taken, ["log", "webhook"], {}),
                Delivery(retried, ["log"], {"webhook": "ConnectError: refused"}),
                Delivery(given_up, ["log"], {"webhook": "ConnectError: refused"}),
            ],
        )
    sasflow("alerts", "ack", str(given_up), "--reason", "seen in the log")

    listed = json.loads(sasflow("alerts", "list", "--undelivered", "-o", "json").output)
    text = sasflow("alerts", "list", "--undelivered").output

    assert [a["id"] for a in listed] == [given_up, retried]
    assert listed[0]["retry_at"] is None, "given up"
    assert listed[1]["retry_at"] is not None
    assert {a["delivery_errors"]["webhook"] for a in listed} == {"ConnectError: refused"}
    assert "2 alert(s) a sink failed to take" in text
    assert f"alert {given_up} (step_failed, raised" in text
    assert "given up" in text
    assert "retried at" in text
    assert "  webhook: ConnectError: refused" in text


def test_alerts_ack_takes_several_ids_and_reports_each_failure(
    engine: Engine, sasflow: Any
) -> None:
    first, acked, last = raise_alerts(engine, 3)
    sasflow("alerts", "ack", str(acked), "--reason", "earlier", "--by", "bob")

    result = sasflow(
        "alerts", "ack", str(first), "999999", str(acked), str(last), "--reason", "bulk",
        "--by", "carol", exit_code=1,
    )  # fmt: skip

    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                select(alerts.c.id, alerts.c.acknowledged_by).where(alerts.c.kind == "step_failed")
            ).all()
        )
    assert rows == {first: "carol", acked: "bob", last: "carol"}
    assert f"acknowledged alert {first} (step_failed) as carol: bulk" in result.stdout
    assert f"acknowledged alert {last} (step_failed) as carol: bulk" in result.stdout
    assert "Error: no alert with id 999999" in result.stderr
    assert f"Error: alert {acked} is already acknowledged (by bob" in result.stderr


def test_alerts_ack_of_several_ids_as_json_lists_each_alert_and_each_error(
    engine: Engine, sasflow: Any
) -> None:
    first, second, third = raise_alerts(engine, 3)

    both = json.loads(
        sasflow("alerts", "ack", str(first), str(second), "--reason", "r", "-o", "json").stdout
    )
    mixed = sasflow(
        "alerts", "ack", str(first), str(third), "--reason", "r", "-o", "json", exit_code=1
    )
    one_failed = sasflow("alerts", "ack", str(first), "--reason", "r", "-o", "json", exit_code=1)

    assert [(a["id"], a["acknowledged"]) for a in both] == [(first, True), (second, True)]
    shown = json.loads(mixed.stdout)
    assert [a["id"] for a in shown] == [third, first]
    assert shown[0]["acknowledged"] is True
    assert shown[1]["error"].startswith(f"alert {first} is already acknowledged (by ")
    assert (one_failed.stdout, "is already acknowledged" in one_failed.stderr) == ("", True)
