"""Approvals (`Step.approval`) end to end on PostgreSQL and RabbitMQ: a scheduler and an agent
run the apps of tests/apps/approvals.py behind `sasflow api`; decisions come by the HTTP API
(scopes, the form, exactly once) and by `sasflow approvals`; the overdue alert is raised once
by the schedulers' event-wait duty."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, select

from sasflow.cli.main import cli
from sasflow.ops import approvals as approval_ops
from sasflow.store.db import make_engine, transaction
from sasflow.store.inbound import approvals
from sasflow.store.schema import alerts, audit, events
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, api_server, make_token
from tests.apps.approvals import desk, registry

pytestmark = pytest.mark.integration

RESCAN = 0.2


@pytest.fixture(scope="module")
def module_names(broker_namespaces: set[str]) -> Names:
    names = Names(services.unique("sftest"))
    broker_namespaces.add(names.namespace)
    return names


@pytest.fixture(scope="module")
def module_engine(module_database: str) -> Iterator[Engine]:
    engine = make_engine(module_database, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def api(
    tmp_path_factory: pytest.TempPathFactory, module_database: str, module_names: Names
) -> Iterator[ApiServer]:
    with api_server(
        tmp_path_factory.mktemp("api"),
        database_url=module_database,
        broker_url=services.broker_url(),
        namespace=module_names.namespace,
        app="tests.apps.approvals",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def roles(module_engine: Engine, module_database: str, module_names: Names) -> Iterator[None]:
    """A scheduler (short rescans: the overdue alert is due within a second) and the agent."""
    with harness.running(
        harness.scheduler(
            module_engine, module_database, registry, module_names, rescan_interval=RESCAN
        ),
        harness.agent(desk, module_names),
    ):
        yield


@pytest.fixture(scope="module")
def tokens(module_engine: Engine) -> dict[str, str]:
    return {
        "refunds": make_token(module_engine, "ann", "approve:refunds", "read"),
        "other": make_token(module_engine, "bob", "approve:other", "approve"),
        "reader": make_token(module_engine, "cat", "read"),
    }


@pytest.fixture
def sasflow(module_database: str, module_names: Names) -> Any:
    def invoke(*args: str, exit_code: int = 0) -> Result:
        env = {"SASFLOW_DATABASE_URL": module_database, "SASFLOW_NAMESPACE": module_names.namespace}
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == exit_code, result.output
        return result

    return invoke


def _steps(engine: Engine, run_id: int) -> dict[str, Any]:
    return {r.name: r for r in harness.step_rows(engine, run_id) if r.kind == "forward"}


def _open(engine: Engine, names: Names, workflow: str, key: str) -> int:
    """A run submitted and brought to its open approval by the scheduler and the agent."""
    run_id = harness.submit(engine, registry, names, workflow, key=key, run_input={"order": key})
    step = "sign" if workflow == "quick" else "review"
    harness.wait_for(
        lambda: _steps(engine, run_id)[step].state == "pending", what=f"{key}'s approval opens"
    )
    return run_id


def _run_state(engine: Engine, run_id: int) -> str:
    return harness.run_states(engine)[run_id]


def _path(run_id: int, verb: str) -> str:
    return f"/v1/runs/{run_id}/steps/review/{verb}"


@pytest.mark.usefixtures("roles")
def test_approve_by_api_needs_the_groups_scope_checks_the_form_and_completes_the_run(
    api: ApiServer, module_engine: Engine, module_names: Names, tokens: dict[str, str]
) -> None:
    run_id = _open(module_engine, module_names, "refund", "R-1")
    good = {"fields": {"amount": "120", "channel": "card"}, "comment": "fine"}
    with api.client(tokens["reader"]) as http:
        [listed] = [
            a for a in http.get("/v1/approvals").json()["approvals"] if a["run_id"] == run_id
        ]
        assert (listed["step"], listed["scope"], sorted(listed["form"])) == (
            "review",
            "approve:refunds",
            ["amount", "channel", "note"],
        )
        refused = http.post(_path(run_id, "approve"), json=good)
        assert refused.status_code == 403
        assert "'approve:refunds' scope" in refused.json()["message"]
    with api.client(tokens["other"]) as http:  # approve and approve:other: not this group
        refused = http.post(_path(run_id, "approve"), json=good)
        assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
    with api.client(tokens["refunds"]) as http:
        bad = http.post(
            _path(run_id, "approve"),
            json={"fields": {"amount": "lots", "channel": "cash", "colour": "red"}},
        )
        assert (bad.status_code, bad.json()["error"]) == (422, "validation_error")
        assert {f["field"]: f["message"] for f in bad.json()["fields"]} == {
            "body.fields.amount": "must be a whole number",
            "body.fields.channel": "must be one of card, bank",
            "body.fields.colour": "not a field of this approval's form",
        }
        assert _steps(module_engine, run_id)["review"].state == "pending"
        done = http.post(_path(run_id, "approve"), json=good)
        assert done.status_code == 200, done.text
        assert (done.json()["decision"], done.json()["by"]) == ("approved", "ann")
        again = http.post(_path(run_id, "reject"), json={"reason": "changed my mind"})
        assert (again.status_code, again.json()["error"]) == (409, "invalid_action")
        assert "already approved by ann" in again.json()["message"]
        missing = http.post(f"/v1/runs/{run_id}/steps/pay/approve", json=good)
        assert (missing.status_code, missing.json()["error"]) == (404, "approval_not_found")
    harness.wait_for(lambda: _run_state(module_engine, run_id) == "completed", what="the run")
    output = _steps(module_engine, run_id)["review"].output
    assert output | {"at": None} == {
        "amount": 120,
        "channel": "card",
        "decision": "approved",
        "by": "ann",
        "at": None,
        "comment": "fine",
    }
    with module_engine.connect() as conn:
        [record] = conn.execute(
            select(audit).where(audit.c.action == "approvals.approve", audit.c.actor == "ann")
        ).all()
    assert (record.reason, record.detail["run_id"], record.detail["amount"]) == (
        "fine",
        run_id,
        120,
    )


@pytest.mark.usefixtures("roles")
def test_reject_by_api_fails_the_run_or_compensates_it(
    api: ApiServer, module_engine: Engine, module_names: Names, tokens: dict[str, str]
) -> None:
    failing = _open(module_engine, module_names, "refund", "R-2")
    undone = _open(module_engine, module_names, "refund_undo", "R-3")
    with api.client(tokens["refunds"]) as http:
        blank = http.post(_path(failing, "reject"), json={"reason": " "})
        assert blank.status_code == 422
        for run_id in (failing, undone):
            done = http.post(_path(run_id, "reject"), json={"reason": "fraud"})
            assert (done.status_code, done.json()["step_state"]) == (200, "error"), done.text
    harness.wait_for(lambda: _run_state(module_engine, failing) == "error", what="R-2 fails")
    harness.wait_for(
        lambda: _run_state(module_engine, undone) == "compensated", what="R-3 compensates"
    )
    error = _steps(module_engine, failing)["review"].error
    assert (error["type"], error["by"], error["reason"]) == (
        "ApprovalRejectedError",
        "ann",
        "fraud",
    )


@pytest.mark.usefixtures("roles")
def test_cli_lists_approves_and_rejects(
    module_engine: Engine, module_names: Names, sasflow: Any
) -> None:
    approved = _open(module_engine, module_names, "refund", "R-4")
    rejected = _open(module_engine, module_names, "refund", "R-5")
    listed = json.loads(sasflow("approvals", "list", "--group", "refunds", "-o", "json").output)
    assert {approved, rejected} <= {a["run_id"] for a in listed}
    bad = sasflow(
        "approvals", "approve", str(approved), "review", "--field", "amount=x", exit_code=1
    )
    assert "amount: must be a whole number" in bad.output
    assert "channel: required" in bad.output
    sasflow(
        "approvals",
        "approve",
        str(approved),
        "review",
        "--field",
        "amount=5",
        "--field",
        "channel=bank",
        "--comment",
        "ok",
        "--by",
        "dan",
    )
    done = sasflow("approvals", "reject", str(rejected), "review", "--reason", "no", "--by", "eve")
    assert f"run {rejected} step review: rejected by eve" in done.output
    twice = sasflow("approvals", "reject", str(approved), "review", "--reason", "x", exit_code=1)
    assert "already approved by dan" in twice.output
    harness.wait_for(lambda: _run_state(module_engine, approved) == "completed", what="R-4")
    harness.wait_for(lambda: _run_state(module_engine, rejected) == "error", what="R-5")
    assert _steps(module_engine, approved)["review"].output["channel"] == "bank"


def _overdue(engine: Engine, run_id: int) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(alerts).where(alerts.c.kind == "approval_overdue", alerts.c.run_id == run_id)
            )
        )


@pytest.mark.usefixtures("roles")
def test_an_undecided_approval_raises_one_overdue_alert_after_escalate_after(
    module_engine: Engine, module_names: Names, sasflow: Any
) -> None:
    run_id = _open(module_engine, module_names, "quick", "Q-1")
    harness.wait_for(lambda: _overdue(module_engine, run_id) != [], what="the overdue alert")
    [alert] = _overdue(module_engine, run_id)
    assert "approval 'sign'" in alert.message
    sign = _steps(module_engine, run_id)["sign"]
    with module_engine.connect() as conn:
        opened = conn.execute(
            select(events.c.created_at).where(
                events.c.step_id == sign.id, events.c.to_state == "pending"
            )
        ).scalar_one()
    # Never before its time, on the database's clock: escalate_after is 1 s.
    assert (alert.created_at - opened).total_seconds() >= 1.0
    # Once: the mark is cleared as the alert is raised, so acknowledged (the approval still
    # open) no later pass raises another.
    assert sign.escalate_at is None
    sasflow("alerts", "ack", str(alert.id), "--reason", "seen")
    with transaction(module_engine) as conn:
        assert approvals.escalate(conn, batch=10, actor="test") == 0
    assert len(_overdue(module_engine, run_id)) == 1
    sasflow("approvals", "approve", str(run_id), "sign", "--comment", "late")
    harness.wait_for(lambda: _run_state(module_engine, run_id) == "completed", what="Q-1")


def test_tokens_take_approver_group_scopes_and_refuse_a_bad_group(sasflow: Any) -> None:
    made = sasflow("tokens", "create", "--name", "gus", "--scope", "approve:refunds")
    assert "(approve:refunds) created" in made.output
    bad = sasflow("tokens", "create", "--name", "hal", "--scope", "approve:re funds", exit_code=1)
    assert "unknown scopes ['approve:re funds']" in bad.output
    bad = sasflow("tokens", "create", "--name", "hal", "--scope", "approver", exit_code=1)
    assert "unknown scopes ['approver']" in bad.output


@pytest.mark.usefixtures("roles")
def test_the_group_filter_applies_before_the_limit(
    module_engine: Engine, module_names: Names
) -> None:
    """An older approval of another group does not hide a group's own from a short list."""
    older = _open(module_engine, module_names, "quick", "G-1")
    mine = _open(module_engine, module_names, "refund", "G-2")
    with transaction(module_engine) as conn:
        first = approval_ops.list_open(conn, limit=1)
        listed = approval_ops.list_open(conn, group="refunds", limit=1)
    assert first[0]["group"] != "refunds", first  # the oldest open one is of another group
    assert [a["group"] for a in listed] == ["refunds"], (older, mine, listed)
