"""`GET /v1/runs/{id}` of a run with a map of 25 items (20 processed, 5 processing) on the real
database: the items are grouped under their map step's `map` (counts by state, the first 20 in
index order, how many more), never in `steps`; `map_items` lists more or none; other steps keep
their fields (`map` null)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from sasflow.transport.topology import Names
from tests import map_runs
from tests.api.server import make_token

pytestmark = pytest.mark.integration


def test_a_runs_detail_groups_its_map_items_under_the_map(
    engine: Engine, database_url: str, names: Names, tmp_path: Path
) -> None:
    run_id = map_runs.map_in_flight(engine, names, 25, 20, key="api")
    reader = make_token(engine, "map-reader", "read")
    with map_runs.serving(tmp_path, database_url, names) as api, api.client(reader) as http:
        detail = http.get(f"/v1/runs/{run_id}").json()
        more = http.get(f"/v1/runs/{run_id}", params={"map_items": 25}).json()
        none = http.get(f"/v1/runs/{run_id}", params={"map_items": 0}).json()
        refused = http.get(f"/v1/runs/{run_id}", params={"map_items": -1})
    assert [s["name"] for s in detail["steps"]] == ["load", "reserve", "ship"]
    load, reserve, ship = detail["steps"]
    assert load["state"] == "processed"
    assert load["map"] is None
    assert load["map_index"] is None
    assert ship["map"] is None
    assert reserve["state"] == "waiting"
    shape = reserve["map"]
    assert {k: shape[k] for k in ("size", "parallelism", "on_item_failure", "counts", "more")} == {
        "size": 25,
        "parallelism": 5,
        "on_item_failure": "fail_fast",
        "counts": {"processed": 20, "processing": 5},
        "more": 5,
    }
    assert [(i["name"], i["map_index"], i["state"]) for i in shape["items"]] == [
        (f"reserve[{i}]", i, "processed") for i in range(20)
    ]
    assert all(i["map_parent"] == reserve["id"] for i in shape["items"])
    listed = more["steps"][1]["map"]
    assert [i["map_index"] for i in listed["items"]] == list(range(25))
    assert [i["state"] for i in listed["items"][20:]] == ["processing"] * 5
    assert listed["more"] == 0
    assert none["steps"][1]["map"]["items"] == []
    assert none["steps"][1]["map"]["more"] == 25
    assert refused.status_code == 422
