"""The console's incidents in headless Chromium: the alerts page groups alerts by cause, an
incident's page lists its runs, and acknowledging ticked incidents goes through a preview, a
required reason and a page that says what was done."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, select

from sasflow import submit_run
from sasflow.states import RunState
from sasflow.store.db import run_transaction
from sasflow.store.outbox.alerts import Alert, AlertKind, raise_alert
from sasflow.store.schema import alerts, audit, incidents
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, make_token
from tests.apps import ops
from tests.ui.conftest import PHONE, WIDE

pytestmark = [pytest.mark.integration, pytest.mark.ui]

FAILING = 3


def _failed_runs(store: Engine, names: Names) -> list[tuple[int, str]]:
    """FAILING runs refused alike by the remote service: (id, business key) each."""
    made = []
    for _ in range(FAILING):
        key = services.unique("order")
        with store.begin() as conn:
            run_id = submit_run(
                conn,
                ops.registry,
                "ops",
                {"value": 1, "fail": True},
                key=key,
                namespace=names.namespace,
            ).run_id
        made.append((run_id, key))
    for run_id, _ in made:
        harness.wait_for(
            lambda r=run_id: harness.run_states(store)[r] == RunState.ERROR,  # type: ignore[misc]
            what=f"run {run_id} in error",
        )
    return made


def _shoot(page: Page, shots: Path, name: str) -> None:
    for label, size in (("wide", WIDE), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.screenshot(path=shots / f"{name}-{label}.png", full_page=True)
    page.set_viewport_size(WIDE)


def _incident_ids(store: Engine) -> list[int]:
    with store.connect() as conn:
        return list(
            conn.execute(
                select(incidents.c.id)
                .where(incidents.c.acknowledged.is_(False))
                .order_by(incidents.c.id)
            ).scalars()
        )


def test_alerts_grouped_by_incident_and_acknowledged_together_after_a_preview(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    name = services.unique("ops")
    token = make_token(store, name, "read", "operate")
    runs = _failed_runs(store, module_names)
    run_transaction(
        store,
        lambda conn: raise_alert(
            conn, Alert(AlertKind.STALLED, "remote", "steps of agent remote wait unclaimed")
        ),
    )
    failed, stalled = _incident_ids(store)

    page.goto(f"{console.base_url}/ui/login")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.goto(f"{console.base_url}/ui/alerts")
    expect(page.get_by_role("heading", level=1)).to_have_text("Alerts")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=f"Incident {failed}"))
    expect(row).to_contain_text("step_failed in ops at step")
    expect(row.get_by_role("cell").nth(3)).to_have_text(str(FAILING))
    _shoot(page, shots, "incidents")  # (test_console photographs its own alerts page)

    row.get_by_role("link", name=f"Incident {failed}").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Incident {failed}: step_failed")
    for run_id, key in runs:  # each alert with its run and business key
        expect(page.get_by_role("row").filter(has_text=key)).to_contain_text(str(run_id))
    _shoot(page, shots, "incident")

    page.goto(f"{console.base_url}/ui/alerts")
    page.get_by_label(f"Select incident {failed}").check()
    page.get_by_label(f"Select incident {stalled}").check()
    page.get_by_role("button", name="Preview acknowledging the selected incidents").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: acknowledge 2 incident(s)")
    confirm = page.get_by_role(
        "button", name=f"Acknowledge these 2 incident(s) ({FAILING + 1} alerts)"
    )
    expect(confirm).to_be_visible()
    _shoot(page, shots, "incidents-preview")
    with store.connect() as conn:  # a preview changes nothing
        assert conn.execute(select(incidents.c.acknowledged)).scalars().all() == [False, False]

    confirm.click()  # no reason: the browser refuses to send the form
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: acknowledge 2 incident(s)")
    page.get_by_label("Reason").fill("remote service refuses, INC-7")
    confirm.click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Acknowledged 2 incident(s)")
    expect(page.get_by_role("status")).to_contain_text(
        f"Acknowledged 2 incident(s) and {FAILING + 1} open alert(s) as {name}: "
        "remote service refuses, INC-7"
    )
    _shoot(page, shots, "incidents-acknowledged")

    with store.connect() as conn:
        acked = conn.execute(
            select(alerts.c.acknowledged_by, alerts.c.acknowledge_reason)
            .where(alerts.c.kind.in_(["step_failed", "stalled"]))
            .distinct()
        ).all()
        audited = conn.execute(
            select(audit.c.actor, audit.c.detail).where(audit.c.action == "incidents.ack")
        ).all()
    assert acked == [(name, "remote service refuses, INC-7")]
    assert sorted(a.detail["incident_id"] for a in audited) == [failed, stalled]
    assert {a.actor for a in audited} == {name}

    page.goto(f"{console.base_url}/ui/alerts")
    expect(page.get_by_role("cell", name="No incident.")).to_be_visible()
