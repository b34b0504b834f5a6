"""Pause and resume in the console (headless Chromium, a real scheduler and agent): the agents
page pauses an agent through a confirmation that requires a reason; a run's page pauses and
resumes the run the same way; a run waits while its agent or itself is paused and completes
once both are resumed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine

from sasflow import submit_run
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


def _confirm(page: Page, label: str, reason: str, button: str) -> None:
    page.get_by_label(label).fill(reason)
    page.get_by_role("button", name=button).click()


def test_pausing_an_agent_and_a_run_from_the_console(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    _sign_in(page, console, store)
    page.goto(f"{console.base_url}/ui/agents")
    page.get_by_role("button", name="Pause remote…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Pause agent remote?")
    page.get_by_role("button", name="Confirm: pause agent remote").click()  # no reason
    expect(page.get_by_role("alert")).to_have_text("a reason is required")
    _confirm(page, "Reason for pausing", "upstream maintenance", "Confirm: pause agent remote")
    expect(page.get_by_role("status")).to_have_text("Agent remote paused")
    expect(page.get_by_role("cell", name="upstream maintenance")).to_be_visible()

    with store.begin() as conn:
        run_id = submit_run(
            conn,
            ops.registry,
            "ops",
            {},
            key=services.unique("k"),
            namespace=module_names.namespace,
        ).run_id
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    page.get_by_role("button", name=f"Pause run {run_id}…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Pause run {run_id}?")
    _confirm(page, "Reason for pausing", "customer asked", f"Confirm: pause run {run_id}")
    expect(page.get_by_role("status")).to_have_text(f"Run {run_id} paused")
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"pending\s+paused$"))
    for label, size in (("wide", WIDE), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.screenshot(path=shots / f"run-paused-{label}.png", full_page=True)
    page.set_viewport_size(WIDE)

    page.goto(f"{console.base_url}/ui/agents")
    page.get_by_role("button", name="Resume remote…").click()
    _confirm(page, "Reason for resuming", "maintenance over", "Confirm: resume agent remote")
    expect(page.get_by_role("status")).to_have_text("Agent remote resumed")
    assert harness.run_states(store)[run_id] == "pending"  # the run itself is still paused
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    page.get_by_role("button", name=f"Resume run {run_id}…").click()
    _confirm(page, "Reason for resuming", "go ahead", f"Confirm: resume run {run_id}")
    # The flash: the run moves on at once, and its live head may add its own status note.
    expect(page.locator("p.flash[role=status]")).to_have_text(f"Run {run_id} resumed")
    harness.wait_for(
        lambda: harness.run_states(store)[run_id] == "completed", what="the resumed run completed"
    )
