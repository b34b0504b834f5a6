"""Approvals in the console (headless Chromium, a real scheduler and agent): the Approvals page
lists an open approval; a token without its scope sees the buttons disabled and why; one with
`approve:refunds` approves it through the confirmation page (a refused field is shown again
with its reason), and the run completes with the form in the step's output."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine

from sasflow import submit_run
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, make_token
from tests.apps import ops
from tests.ui.conftest import WIDE

pytestmark = [pytest.mark.integration, pytest.mark.ui]


def _sign_in(page: Page, console: ApiServer, store: Engine, *scopes: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{console.base_url}/ui/login")
    page.get_by_label("API token").fill(make_token(store, services.unique("ann"), *scopes))
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def _waiting_run(store: Engine, names: Names) -> int:
    with store.begin() as conn:
        run_id = submit_run(
            conn, ops.registry, "signed", {}, key=services.unique("k"), namespace=names.namespace
        ).run_id
    harness.wait_for(
        lambda: any(
            r.name == "sign" and r.state == "pending" for r in harness.step_rows(store, run_id)
        ),
        what="the approval opens",
    )
    return run_id


def test_approving_from_the_approvals_page(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    run_id = _waiting_run(store, module_names)
    _sign_in(page, console, store, "read", "approve")
    page.goto(f"{console.base_url}/ui/approvals")
    row = page.locator(f"#approval-{run_id}-sign")
    expect(row.get_by_role("button", name="Approve sign…")).to_be_disabled()
    expect(row).to_contain_text("Your token lacks the 'approve:refunds' scope")

    _sign_in(page, console, store, "read", "approve:refunds")
    page.goto(f"{console.base_url}/ui/approvals")
    page.set_viewport_size(WIDE)
    page.screenshot(path=shots / "approvals-wide.png", full_page=True)
    page.locator(f"#approval-{run_id}-sign").get_by_role("button", name="Approve sign…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Approve sign of run {run_id}?")
    page.get_by_label("amount").fill("many")
    page.get_by_role("button", name="Confirm: approve sign").click()
    expect(page.get_by_role("alert")).to_have_text("must be a whole number")
    page.get_by_label("amount").fill("120")
    page.get_by_label("Comment (optional)").fill("fine")
    page.get_by_role("button", name="Confirm: approve sign").click()
    expect(page.locator("p.flash[role=status]")).to_have_text(
        f"Run {run_id}: sign approved (run running)"
    )
    harness.wait_for(
        lambda: harness.run_states(store)[run_id] == "completed", what="the approved run"
    )
    [sign] = [r for r in harness.step_rows(store, run_id) if r.name == "sign"]
    assert (sign.output["amount"], sign.output["comment"]) == (120, "fine")
    assert sign.output["by"].startswith("ann")


def test_the_run_page_shows_the_open_approval_and_rejects_it(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    run_id = _waiting_run(store, module_names)
    _sign_in(page, console, store, "read", "admin")
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    section = page.locator("#approval-sign")
    expect(section).to_contain_text("approve:refunds")
    section.get_by_role("button", name="Reject sign…").click()
    page.get_by_role("button", name="Confirm: reject sign").click()  # no reason
    expect(page.get_by_role("alert")).to_have_text("a reason is required")
    page.get_by_label("Reason for rejecting").fill("not ours")
    page.get_by_role("button", name="Confirm: reject sign").click()
    expect(page.locator("p.flash[role=status]")).to_have_text(
        f"Run {run_id}: sign rejected (run error)"
    )
    assert harness.run_states(store)[run_id] == "error"
