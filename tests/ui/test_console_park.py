"""Unpark and fail in the console (headless Chromium, a real scheduler and agent): a run's page
shows a parked badge and what is parked; *Unpark* and *Fail* go through a confirmation page
that requires a reason; an unparked run completes, a failed one ends in error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, update

from sasflow import submit_run
from sasflow.commands import StoredError
from sasflow.store.schema import runs, steps
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, make_token
from tests.apps import ops
from tests.ui.conftest import PHONE, WIDE

pytestmark = [pytest.mark.integration, pytest.mark.ui]


def _sign_in(page: Page, console: ApiServer, store: Engine) -> None:
    page.goto(f"{console.base_url}/ui/login")
    page.get_by_label("API token").fill(
        make_token(store, services.unique("ops"), "read", "operate")
    )
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def _parked_run(store: Engine, names: Names) -> int:
    """A running run of `ops` whose first step is parked, as if its failures had run out:
    parked in the transaction that submits it, so no scheduler ever sees it pending."""
    with store.begin() as conn:
        run_id = submit_run(
            conn, ops.registry, "ops", {}, key=services.unique("k"), namespace=names.namespace
        ).run_id
        conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.name == "a")
            .values(
                state="parked",
                attempt=3,
                failure_count=3,
                error=StoredError("ConnectionError", "partner down").to_json(),
            )
        )
        conn.execute(update(runs).where(runs.c.id == run_id).values(state="running"))
    return run_id


def _confirm(page: Page, label: str, reason: str, button: str) -> None:
    page.get_by_label(label).fill(reason)
    page.get_by_role("button", name=button).click()


def test_unparking_and_failing_a_parked_run_from_the_console(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    _sign_in(page, console, store)
    unparked, failed = _parked_run(store, module_names), _parked_run(store, module_names)
    page.goto(f"{console.base_url}/ui/runs/{unparked}")
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"running\s+parked$"))
    for label, size in (("wide", WIDE), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.screenshot(path=shots / f"run-parked-{label}.png", full_page=True)
    page.set_viewport_size(WIDE)
    page.get_by_role("button", name=f"Unpark run {unparked}…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Unpark run {unparked}?")
    page.get_by_role("button", name=f"Confirm: unpark run {unparked}").click()  # no reason
    expect(page.get_by_role("alert")).to_have_text("a reason is required")
    _confirm(page, "Reason for unparking", "partner fixed", f"Confirm: unpark run {unparked}")
    # The flash: the run moves on at once, and its live head may add its own status note.
    expect(page.locator("p.flash[role=status]")).to_have_text(f"Run {unparked} unparked: a")
    harness.wait_for(
        lambda: harness.run_states(store)[unparked] == "completed",
        what="the unparked run completed",
    )

    page.goto(f"{console.base_url}/ui/runs/{failed}")
    page.get_by_role("button", name=f"Fail run {failed}…").click()
    _confirm(page, "Reason for failing", "order void", f"Confirm: fail run {failed}")
    # The flash: the run moves on at once, and its live head may add its own status note.
    expect(page.locator("p.flash[role=status]")).to_have_text(f"Run {failed} failed: a")
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"error$"))
    assert harness.run_states(store)[failed] == "error"
