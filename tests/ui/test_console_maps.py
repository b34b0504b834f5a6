"""A run's page shows its map's shape: the map as one box with its items' counts by state
(`25 items`, `20 processed, 5 processing`) linked to its items, the items listed under the map
step with their index (the first 20, then "and 5 more", which lists them all), never as steps
of their own. The run is driven by hand (tests.map_runs): no scheduler or agent runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import Engine

from sasflow.transport.topology import Names
from tests import map_runs, services
from tests.api.server import ApiServer, make_token
from tests.ui.conftest import WIDE

pytestmark = [pytest.mark.integration, pytest.mark.ui]


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory, module_database: str, module_names: Names
) -> Iterator[ApiServer]:
    """The console of an app with map steps (tests.apps.maps)."""
    with map_runs.serving(
        tmp_path_factory.mktemp("console"), module_database, module_names
    ) as server:
        yield server


def test_the_run_page_shows_the_map_with_its_counts_and_its_first_items(
    page: Page, console: ApiServer, store: Engine, module_names: Names, shots: Path
) -> None:
    run_id = map_runs.map_in_flight(store, module_names, 25, 20, key=services.unique("map"))
    token = make_token(store, services.unique("reader"), "read")
    page.set_viewport_size(WIDE)
    page.goto(f"{console.base_url}/ui/login")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.goto(f"{console.base_url}/ui/runs/{run_id}")

    box = page.locator('svg g.node[data-step="reserve"]')
    expect(box).to_contain_text("25 items")
    expect(box).to_contain_text("20 processed, 5 processing")
    expect(page.locator('svg a[href$="#map-reserve"]')).to_have_count(1)
    steps = page.get_by_role("table").first
    expect(steps.locator(":scope > tbody > tr > th[scope=row]")).to_have_text(
        ["load", "reserve", "ship"]
    )
    listed = page.locator("#map-reserve")
    expect(listed.locator(".map-counts")).to_contain_text("25 items: 20 processed, 5 processing")
    rows = listed.locator("table.items tbody tr")
    expect(rows).to_have_count(20)
    expect(rows.locator("th")).to_have_text([str(i) for i in range(20)])
    page.screenshot(path=str(shots / "run-map.png"), full_page=True)

    listed.get_by_role("link", name="and 5 more").click()
    expect(rows).to_have_count(25)
    expect(rows.nth(24).locator("th")).to_have_text("24")
    expect(rows.nth(24)).to_contain_text("processing")
    expect(listed.locator(".map-more")).to_have_count(0)
