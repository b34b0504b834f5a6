"""A parent and its child linked both ways in the run detail: `sasflow runs show` (lines and
JSON) and `GET /v1/runs/{id}` (docs/concepts.md "Child workflows", docs/api.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from sasflow.cli.main import cli
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, api_server, make_token
from tests.apps import child_workflows as app
from tests.integration.test_child_workflows import pack_by_hand

pytestmark = pytest.mark.integration


def _parent_and_child(engine: Engine, names: Names, key: str) -> tuple[int, int]:
    """A run of `order` whose step `ship` started its child (pack processed by hand)."""
    run_id = harness.submit(engine, app.registry, names, "order", key=key, run_input={"order": 1})
    pack_by_hand(engine, run_id)
    [ship] = [r for r in harness.step_rows(engine, run_id) if r.name == "ship"]
    return run_id, int(ship.input["child"]["run_id"])


def test_runs_show_links_the_parent_and_its_child(
    engine: Engine, database_url: str, names: Names
) -> None:
    parent, child = _parent_and_child(engine, names, "cli")
    env = {"SASFLOW_DATABASE_URL": database_url, "SASFLOW_APP": "tests.apps.child_workflows"}

    def show(run_id: int, *options: str) -> str:
        result = CliRunner().invoke(cli, ["runs", "show", str(run_id), *options], env=env)
        assert result.exit_code == 0, result.output
        return result.output

    assert f"  children: run {child}" in show(parent)
    assert f"  parent: run {parent}, step ship" in show(child)
    detail = json.loads(show(child, "--output", "json"))["run"]
    assert (detail["parent_run_id"], detail["parent_step"], detail["children"]) == (
        parent,
        "ship",
        [],
    )


@pytest.fixture(scope="module")
def module_engine(module_database: str) -> Iterator[Engine]:
    engine = make_engine(module_database, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def api(
    tmp_path_factory: pytest.TempPathFactory, module_database: str, broker_namespaces: set[str]
) -> Iterator[ApiServer]:
    names = Names(services.unique("sftest"))
    broker_namespaces.add(names.namespace)
    with api_server(
        tmp_path_factory.mktemp("api"),
        database_url=module_database,
        broker_url=services.broker_url(),
        namespace=names.namespace,
    ) as server:
        yield server


def test_the_api_run_detail_links_the_parent_and_its_child(
    api: ApiServer, module_engine: Engine
) -> None:
    parent, child = _parent_and_child(module_engine, Names(services.unique("sftest")), "http")
    reader = make_token(module_engine, "child-reader", "read")
    with api.client(reader) as http:
        up = http.get(f"/v1/runs/{parent}").json()["run"]
        down = http.get(f"/v1/runs/{child}").json()["run"]
    assert (up["children"], up["parent_run_id"], up["parent_step"]) == ([child], None, None)
    assert (down["children"], down["parent_run_id"], down["parent_step"]) == ([], parent, "ship")
