"""The console's operator tools in headless Chromium: the runs search finds a run by a word
only its step's error holds; the workflow pages draw bars and points for a workflow with runs;
a bulk cancel previews exactly the runs it stops and confirming stops those only; a schedule's
trigger asks for a confirmation, then says what it did."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine, select, update

from sasflow.schedules.definition import Schedule
from sasflow.states import RunState
from sasflow.store.schema import audit, steps
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.cluster import add_schedule
from tests.api.server import ApiServer, make_token
from tests.apps import ops
from tests.ui.conftest import PHONE, WIDE
from tests.ui.runs import submit as _submit
from tests.ui.runs import wait_state as _wait_state

pytestmark = [pytest.mark.integration, pytest.mark.ui]


def _sign_in(page: Page, console: ApiServer, store: Engine) -> str:
    """An operator signed in; their name."""
    name = services.unique("ops")
    page.goto(f"{console.base_url}/ui/login")
    page.get_by_label("API token").fill(make_token(store, name, "read", "operate"))
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    return name


def _shoot(page: Page, shots: Path, name: str) -> None:
    for label, size in (("wide", WIDE), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.screenshot(path=shots / f"{name}-{label}.png", full_page=True)
    page.set_viewport_size(WIDE)


def test_search_finds_a_run_by_a_word_only_its_step_error_holds(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    """The word is in no key and no input: only in the error step b reported (written here
    as its agent would have); the search finds that run and no other, in any case."""
    word = services.unique("Zebra")
    failed = _submit(store, module_names, services.unique("se"), value=1, fail=True)
    other = _submit(store, module_names, services.unique("se"), value=2, fail=True)
    for run_id in (failed, other):
        _wait_state(store, run_id, RunState.ERROR)
    with store.begin() as conn:
        conn.execute(
            update(steps)
            .where(steps.c.run_id == failed, steps.c.name == "b")
            .values(error={"type": "PermanentError", "message": f"remote refused b: {word}"})
        )
    _sign_in(page, console, store)
    page.goto(f"{console.base_url}/ui/runs")
    page.get_by_label("Text (key, input, output, errors)").fill(word.lower())
    page.get_by_role("button", name="Filter", exact=True).click()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first.get_by_role("link", name=str(failed), exact=True)).to_be_visible()
    _shoot(page, shots, "runs-search")


AS_TALL_AS_DRAWN = (
    "el => parseFloat(getComputedStyle(el).height) === parseFloat(el.getAttribute('height'))"
)
"""Is this SVG shape as tall as its `height` attribute (no stylesheet rule overriding it)?"""


def test_the_workflow_pages_chart_a_workflow_with_runs(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    """Finished runs of `ops` (one failed) appear in the workflows list and as bars, failure
    rate points and duration points on its page, with the figures in a table; each window
    draws."""
    good = _submit(store, module_names, services.unique("ch"), value=1)
    bad = _submit(store, module_names, services.unique("ch"), value=2, fail=True)
    _wait_state(store, good, RunState.COMPLETED)
    _wait_state(store, bad, RunState.ERROR)
    _sign_in(page, console, store)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Workflows").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Workflows")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name="ops", exact=True))
    cells = row.get_by_role("cell")
    assert int(cells.nth(0).inner_text()) >= 2  # finished in the last hour
    assert int(cells.nth(2).inner_text()) >= 1  # failed in the last day
    _shoot(page, shots, "workflows")
    row.get_by_role("link", name="ops", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Workflow ops")
    for window in ("1h", "7d", "24h"):
        page.get_by_role("link", name=f"last {window}").click()
        expect(page.get_by_role("link", name=f"last {window}")).to_have_attribute(
            "aria-current", "page"
        )
        throughput = page.locator("svg[data-chart=throughput]")
        expect(throughput.locator("rect.bar").first).to_be_visible()
        expect(throughput.locator("rect.bar-failed").first).to_be_visible()
        # drawn as tall as the chart says (the run page's attempt bars' CSS stays theirs)
        assert throughput.locator("rect.bar").first.evaluate(AS_TALL_AS_DRAWN)
        expect(page.locator("svg[data-chart='failure rate'] circle.point").first).to_be_visible()
        expect(page.locator("svg[data-chart=duration] circle.p95").first).to_be_visible()
        figures = page.get_by_role("table", name="Figures").locator("tbody tr")
        assert sum(int(r.split("\t")[1]) for r in figures.all_inner_texts()) >= 2
    _shoot(page, shots, "workflow")


def test_bulk_cancel_previews_the_runs_and_confirming_cancels_exactly_them(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    """The filter matches two running runs and a completed one: the preview lists the two
    running ones and changes nothing; a run that starts matching after the preview is left
    alone by the confirmation, which cancels the two and says so."""
    tag = services.unique("bc")
    done = _submit(store, module_names, f"{tag}-done", value=1)
    _wait_state(store, done, RunState.COMPLETED)
    busy = [_submit(store, module_names, f"{tag}-{i}", value=1, delay=8) for i in range(2)]
    for run_id in busy:
        _wait_state(store, run_id, RunState.RUNNING)
    _sign_in(page, console, store)
    page.goto(f"{console.base_url}/ui/runs?text={tag}")
    expect(page.locator("tbody tr")).to_have_count(3)
    page.get_by_role("button", name="Preview cancelling every run the filter matches").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: cancel 2 run(s)")
    preview = page.locator("tbody tr").all_inner_texts()
    cells = [row.split("\t") for row in preview]
    assert [(c[0], c[2]) for c in cells] == [(str(r), "cancelled") for r in busy]
    assert all(c[1] for c in cells)  # the steps it stops (b at least)
    assert {harness.run_states(store)[r] for r in busy} == {RunState.RUNNING}  # rolled back
    _shoot(page, shots, "bulk-cancel")
    late = _submit(store, module_names, f"{tag}-late", value=1, delay=8)
    _wait_state(store, late, RunState.RUNNING)
    page.get_by_label("Reason for cancelling").fill("wrong batch")
    page.get_by_role("button", name="Cancel these 2 run(s)").click()
    expect(page.get_by_role("status")).to_have_text("2 runs cancelled")
    expect(page.get_by_role("heading", level=1)).to_have_text("Cancelled 2 run(s)")
    states = harness.run_states(store)
    assert [states[r] for r in (*busy, late, done)] == [
        RunState.CANCELLED,
        RunState.CANCELLED,
        RunState.RUNNING,
        RunState.COMPLETED,
    ]
    page.goto(f"{console.base_url}/ui/runs/{late}")  # the one-run cancel says what it did too
    page.get_by_label("Reason for cancelling").fill("also wrong")
    page.get_by_role("button", name=f"Cancel run {late}").click()
    expect(page.get_by_role("status")).to_have_text(f"Run {late} cancelled")
    page.reload()  # shown once
    expect(page.get_by_role("status")).to_have_count(0)


def test_a_schedule_trigger_asks_for_confirmation_then_says_what_it_did(
    page: Page, console: ApiServer, store: Engine, shots: Path
) -> None:
    """Trigger on the schedules list opens a confirmation page (nothing fired yet); confirming
    with a reason fires it once and the list says which run it submitted; the audit has the
    reason."""
    schedule = add_schedule(
        store, Schedule(services.unique("nightly"), "ops", cron="0 2 * * *"), ops.registry
    )
    label = schedule["name"]
    name = _sign_in(page, console, store)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Schedules").click()
    page.get_by_role("button", name=f"Trigger {label}…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Trigger schedule {label}?")
    _shoot(page, shots, "confirm")

    def done() -> list[tuple[str, str | None]]:
        with store.connect() as conn:
            found = conn.execute(
                select(audit.c.action, audit.c.reason).where(audit.c.actor == name)
            ).all()
        return [(str(a), r) for a, r in found]

    assert done() == []  # a page, not an action
    page.get_by_label("Reason for triggering (optional)").fill("rerun after the fix")
    page.get_by_role("button", name=f"Confirm: trigger {label}").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Schedules")
    message = page.get_by_role("status")
    expect(message).to_have_text(re.compile(rf"^Schedule {label} triggered: run \d+ submitted$"))
    _shoot(page, shots, "flash")
    assert done() == [("schedules.trigger", "rerun after the fix")]
