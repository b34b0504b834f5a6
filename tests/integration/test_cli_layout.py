"""The operator's tables at 80 columns, piped and wide (`runs list`, `runs show`, `alerts
list`) on a run that really failed: nothing cut with an ellipsis, errors read "step: Type:
message", times compact, droppable columns dropped and named; `-o json` keeps every field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine

from sasflow.cli.main import cli
from sasflow.transport.topology import Names
from tests import harness
from tests.apps import checkout

pytestmark = pytest.mark.integration

Sasflow = Callable[..., Result]
BOX_TOP = "┏"
COMPACT_TIME = re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b")
FULL_ERROR = f"process_payment: PermanentError: {checkout.DECLINED}"


@pytest.fixture
def sasflow(database_url: str, names: Names) -> Sasflow:
    def invoke(*args: str, columns: int | None) -> Result:
        env = {
            "SASFLOW_DATABASE_URL": database_url,
            "SASFLOW_NAMESPACE": names.namespace,
            # None unsets it: CliRunner's output is no terminal, as a pipe, so rich lays
            # out for 80 columns unless $COLUMNS says otherwise.
            "COLUMNS": None if columns is None else str(columns),
        }
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result

    return invoke


@pytest.fixture
def failed_run(engine: Engine, database_url: str, names: Names) -> int:
    """A checkout refused at its payment step (the scheduler raises its alert)."""
    with harness.running(
        harness.scheduler(engine, database_url, checkout.registry, names, rescan_interval=0.1),
        harness.agent(checkout.payments, names),
    ):
        run_id = harness.submit(
            engine,
            checkout.registry,
            names,
            "checkout_with_payment",
            key="order-A-471",
            run_input={"sku": "sku-1"},
        )
        harness.wait_for(lambda: harness.run_states(engine)[run_id] == "error", what="error")
    return run_id


def _tables(output: str) -> list[list[list[str]]]:
    """Each table's lines (header first) as their cells' text."""
    found: list[list[list[str]]] = []
    for line in output.splitlines():
        if line.startswith(BOX_TOP):
            found.append([])
        elif found and line[:1] in ("┃", "│"):
            found[-1].append([part.strip() for part in re.split("[┃│]", line)[1:-1]])
    return found


def _column(table: list[list[str]], name: str) -> str:
    """A column's text, its folded lines joined by spaces."""
    index = table[0].index(name)
    return " ".join(row[index] for row in table[1:] if row[index])


def _header(table: list[list[str]]) -> list[str]:
    return table[0]


def _assert_readable(output: str, width: int) -> None:
    assert "…" not in output, output
    for line in output.splitlines():
        if line[:1] in "┏┃┡│└":
            assert len(line) <= width, line
    assert not re.search(r"\b20\d\d-\d\d-\d\d", output), "the year is the database's: not shown"


@pytest.mark.parametrize("columns", [80, None], ids=["80-columns", "piped"])
def test_runs_list_at_80_columns(failed_run: int, sasflow: Sasflow, columns: int | None) -> None:
    output = sasflow("runs", "list", columns=columns).output

    _assert_readable(output, 80)
    (table,) = _tables(output)
    assert _column(table, "error") == FULL_ERROR
    assert _column(table, "workflow") == "checkout_with_payment"
    assert _column(table, "id") == str(failed_run)
    assert _header(table) == ["id", "workflow", "key", "state", "error"]
    assert "not shown at 80 columns: v, created, finished (see -o json)" in output


def test_runs_list_at_140_columns_shows_every_column_and_the_error_whole(
    failed_run: int, sasflow: Sasflow
) -> None:
    output = sasflow("runs", "list", columns=140).output

    (table,) = _tables(output)
    assert _header(table) == [
        "id",
        "workflow",
        "v",
        "key",
        "state",
        "created",
        "finished",
        "error",
    ]
    assert _column(table, "error") == FULL_ERROR, "folded, not cut nor raw JSON"
    assert _column(table, "workflow") == "checkout_with_payment"
    assert COMPACT_TIME.search(_column(table, "created"))
    assert "not shown" not in output


@pytest.mark.parametrize("columns", [80, None], ids=["80-columns", "piped"])
def test_runs_show_at_80_columns(failed_run: int, sasflow: Sasflow, columns: int | None) -> None:
    output = sasflow("runs", "show", str(failed_run), columns=columns).output

    _assert_readable(output, 80)
    assert COMPACT_TIME.search(output), output
    assert f"  error: {FULL_ERROR}\n" in output
    assert f"step process_payment attempt 1: error: PermanentError: {checkout.DECLINED}\n" in (
        output
    )
    steps, timeline = _tables(output)
    assert _column(steps, "name") == "reserve_inventory process_payment"
    assert _column(steps, "error") == f"PermanentError: {checkout.DECLINED}"
    assert "locked_by" not in _header(steps)
    assert {"name", "state", "attempt", "error"} <= set(_header(steps))
    assert "process_payment" in _column(timeline, "what").split()
    assert {"at", "what", "to", "reason"} <= set(_header(timeline))


def test_runs_show_json_keeps_every_field(failed_run: int, sasflow: Sasflow) -> None:
    shown = json.loads(sasflow("runs", "show", str(failed_run), "-o", "json", columns=80).output)

    error = shown["run"]["error"]
    assert error["step"] == "process_payment"
    assert (error["error"]["type"], error["error"]["message"]) == (
        "PermanentError",
        checkout.DECLINED,
    )
    assert "Traceback (most recent call last)" in error["error"]["traceback"]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", shown["run"]["created_at"])
    assert {"locked_by", "complete_by", "failure_count"} <= set(shown["steps"][0])


@pytest.mark.parametrize("columns", [80, None], ids=["80-columns", "piped"])
def test_alerts_list_at_80_columns_keeps_the_whole_cause(
    failed_run: int, sasflow: Sasflow, columns: int | None
) -> None:
    output = sasflow("alerts", "list", columns=columns).output

    _assert_readable(output, 80)
    (table,) = _tables(output)
    assert COMPACT_TIME.search(_column(table, "created"))
    message = _column(table, "message")
    assert message.startswith(f"run {failed_run} of checkout_with_payment (key order-A-471)")
    assert message.endswith(f"PermanentError: {checkout.DECLINED}"), message
