"""The API's response models (no server, no database): every JSON answer of /v1 is a named
`...Response` schema in OpenAPI (and the backlog's 429 is documented), and a model of a store
row names its fields in the row's column order, which keeps the keys of the JSON in the order
the store gives them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import ColumnElement

from sasflow.api import responses
from sasflow.api.app import create_app
from sasflow.api.context import ApiContext
from sasflow.registry import Registry
from sasflow.settings import Settings
from sasflow.store.db import make_engine
from sasflow.store.operator import inspect
from sasflow.store.outbox import alerts as alert_store
from sasflow.store.outbox import incidents as incident_store
from sasflow.store.schema import alerts, flow_limits, runs

ROWS: list[tuple[type[BaseModel], Iterable[ColumnElement[Any]]]] = [
    (responses.RunResponse, runs.c),
    (responses.RunSummaryResponse, inspect._RUN_COLUMNS),
    (responses.StepResponse, inspect._STEP_COLUMNS),
    (responses.EventResponse, inspect._EVENT_COLUMNS),
    (responses.AlertResponse, alerts.c),
    (responses.AlertSummaryResponse, alert_store.LIST_COLUMNS),
    (responses.LimitResponse, flow_limits.c),
    (responses.IncidentSummaryResponse, incident_store.LIST_COLUMNS),
]
COMPUTED = {
    responses.RunResponse: ["parked", "children"],
    responses.StepResponse: ["waiting", "skipped", "map"],
    responses.LimitResponse: ["description", "burst_effective", "state", "created"],
    responses.IncidentSummaryResponse: ["sample_runs"],
}
"""Fields computed by the services, named after the row's columns."""


@pytest.mark.parametrize(("model", "columns"), ROWS, ids=[m.__name__ for m, _ in ROWS])
def test_a_row_model_names_the_columns_in_their_order(
    model: type[BaseModel], columns: Iterable[ColumnElement[Any]]
) -> None:
    """Named fields are serialized first, extra keys after them: the fields are the row's
    first columns, in order (a column added at the end passes through as an extra key)."""
    names = [str(c.name) for c in columns]
    computed = COMPUTED.get(model, [])
    fields = list(model.model_fields)
    assert fields == names[: len(fields) - len(computed)] + computed


@pytest.fixture
def openapi(tmp_path: Path) -> Iterator[dict[str, Any]]:
    url = f"sqlite:///{tmp_path / 'unused.db'}"
    engine = make_engine(url)
    settings = Settings(database_url=url, broker_url="memory://", namespace="openapi")
    try:
        yield create_app(ApiContext(engine, Registry(), settings, lambda: None)).openapi()
    finally:
        engine.dispose()


def test_every_json_answer_of_v1_is_a_named_response_schema(openapi: dict[str, Any]) -> None:
    """One style for every resource: the success answers' schemas are `...Response` models
    (the stream's answer is RecordIO or empty, not JSON)."""
    untyped = []
    for path, operations in openapi["paths"].items():
        if not path.startswith("/v1/") or path == "/v1/stream":
            continue
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if not status.startswith("2"):
                    continue
                ref = answer["content"]["application/json"]["schema"].get("$ref", "")
                if not ref.endswith("Response"):
                    untyped.append(f"{method.upper()} {path} {status}")
    assert untyped == []
    schemas = openapi["components"]["schemas"]
    assert {"RunDetailResponse", "RunListResponse", "AlertListResponse"} <= set(schemas)


def test_openapi_documents_the_429(openapi: dict[str, Any]) -> None:
    """`POST /v1/runs` past a workflow's bound: 429 with Retry-After and the problem body
    (docs/backpressure.md; tests/integration/test_backpressure_api.py sends it)."""
    answer = openapi["paths"]["/v1/runs"]["post"]["responses"]["429"]
    assert "Retry-After" in answer["headers"]
    schema = answer["content"]["application/json"]["schema"]["$ref"]
    assert schema.endswith("/BacklogFullResponse")
