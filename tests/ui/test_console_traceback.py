"""The run page shows a failed step's handler traceback, collapsed under its error."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine

from sasflow import submit_run
from sasflow.states import RunState
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, make_token
from tests.apps import ops

pytestmark = [pytest.mark.integration, pytest.mark.ui]


def test_the_run_page_shows_the_traceback_collapsed(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    with store.begin() as conn:
        run_id = submit_run(
            conn,
            ops.registry,
            "ops",
            {"value": 1, "fail": True},
            key=services.unique("tb"),
            namespace=module_names.namespace,
        ).run_id
    harness.wait_for(lambda: harness.run_states(store)[run_id] == RunState.ERROR, what="error")
    token = make_token(store, services.unique("reader"), "read")
    page.goto(f"{console.base_url}/ui/login")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.goto(f"{console.base_url}/ui/runs/{run_id}")

    steps = page.get_by_role("table").first
    summary = steps.locator("details.traceback summary")
    expect(summary).to_have_text("Traceback")
    text = steps.locator("details.traceback pre")
    expect(text).to_be_hidden()  # collapsed until asked for
    summary.click()
    expect(text).to_be_visible()
    expect(text).to_contain_text("Traceback (most recent call last):")
    expect(text).to_contain_text("in call_remote")
    expect(text).to_contain_text("PermanentError: remote refused")
