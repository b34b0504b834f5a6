"""`GET /v1/runs/{id}` of a run with a map of 25 items (20 processed, 5 processing) on the real
database: the items are grouped under their map step's `map` (counts by state, the first 20 in
index order, how many more), never in `steps`; `map_items` lists more or none; other steps keep
their fields (`map` null)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import map_runs, services
from tests.api.server import ApiServer, api_server, make_token

pytestmark = pytest.mark.integration


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
        app="tests.apps.maps",
    ) as server:
        yield server


def test_a_runs_detail_groups_its_map_items_under_the_map(
    api: ApiServer, module_engine: Engine, module_names: Names
) -> None:
    run_id = map_runs.map_in_flight(module_engine, module_names, 25, 20, key="api")
    reader = make_token(module_engine, "map-reader", "read")
    with api.client(reader) as http:
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
