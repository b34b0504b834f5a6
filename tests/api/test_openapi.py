"""The OpenAPI document says what the API answers (no server, no database): every error
status of every operation with the one error schema and its codes, the bearer scheme with the
scope of each operation, examples for every request body; and the codes are one list, the
same in the handlers, in the document and in docs/api.md. tests/api/test_fuzz.py checks the
document against a real server."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from sasflow.api import errors, models
from sasflow.api.app import create_app
from sasflow.api.codes import CODES
from sasflow.api.context import ApiContext
from sasflow.api.stream.calls import parse_call
from sasflow.ops.tokens import SCOPES
from sasflow.registry import Registry
from sasflow.settings import Settings
from sasflow.store.db import make_engine

REPO = Path(__file__).resolve().parents[2]
BODY_MODELS: dict[str, type[BaseModel]] = {
    model.__name__: model
    for model in (
        models.RunRequest,
        models.BatchRequest,
        models.CancelRequest,
        models.ResubmitRequest,
        models.AcknowledgeRequest,
        models.OperatorActionRequest,
        models.LimitRequest,
        models.PauseRequest,
        models.ParkRequest,
        models.AgentPauseRequest,
        models.EventRequest,
        models.ApproveRequest,
        models.RejectRequest,
    )
}


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('openapi') / 'unused.db'}"
    engine = make_engine(url)
    settings = Settings(database_url=url, broker_url="memory://", namespace="openapi")
    try:
        yield create_app(ApiContext(engine, Registry(), settings, lambda: None)).openapi()
    finally:
        engine.dispose()


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            yield f"{method.upper()} {path}", operation


def _error_codes(answer: dict[str, Any], document: dict[str, Any]) -> set[str]:
    """The codes an error answer's schema admits (its enum, or its model's literal)."""
    schema = answer["content"]["application/json"]["schema"]
    if "$ref" in schema:
        model = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        return {model["properties"]["error"]["const"]}
    base, narrowed = schema["allOf"]
    assert base == {"$ref": "#/components/schemas/ErrorResponse"}
    return set(narrowed["properties"]["error"]["enum"])


def test_every_error_answer_has_the_error_schema_and_its_codes(document: dict[str, Any]) -> None:
    """No FastAPI `{"detail": [...]}`: each 4xx/5xx is the ErrorResponse, narrowed to codes of
    that status, each with an example; a 422 has `fields`."""
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert "ValidationError" not in schemas
    assert {"ErrorResponse", "FieldProblem"} <= set(schemas)
    for name, operation in _operations(document):
        for status, answer in operation["responses"].items():
            if int(status) < 400:
                continue
            codes = _error_codes(answer, document)
            assert codes, name
            assert {CODES[code].status for code in codes} == {int(status)}, (name, status)
            examples = answer["content"]["application/json"]["examples"]
            assert set(examples) == codes, (name, status)
            for code in codes:
                assert f"`{code}`" in answer["description"], (name, code)
            if status == "422":
                assert answer["content"]["application/json"]["schema"]["allOf"][1]["required"] == [
                    "fields"
                ]


def test_every_operation_names_its_scope_and_its_auth_answers(document: dict[str, Any]) -> None:
    scheme = document["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    scopes = {}
    for name, operation in _operations(document):
        if name in {"GET /healthz", "GET /readyz"}:
            assert "security" not in operation
            continue
        [requirement] = operation["security"]
        [scope] = requirement["bearer"]
        scopes[name] = scope
        assert {"401", "403", "422", "503"} <= set(operation["responses"]), name
        assert operation["responses"]["401"]["headers"]["WWW-Authenticate"]["required"]
    assert set(scopes.values()) == set(SCOPES) - {"admin"}
    assert scopes["POST /v1/runs"] == "submit"
    assert scopes["POST /v1/runs/{run_id}/cancel"] == "operate"
    assert scopes["GET /v1/runs/{run_id}"] == "read"


def test_every_request_body_has_examples_the_server_accepts(document: dict[str, Any]) -> None:
    """An example is a body the schema's model accepts (the stream's: a well-formed call); an
    operation with a body may answer what the body limits answer."""
    with_body = 0
    for name, operation in _operations(document):
        if "requestBody" not in operation:
            continue
        with_body += 1
        assert {"400", "408", "413", "422"} <= set(operation["responses"]), name
        content = operation["requestBody"]["content"]["application/json"]
        examples = content["examples"]
        assert examples, name
        ref = content["schema"].get("$ref") or next(
            option["$ref"] for option in content["schema"]["anyOf"] if "$ref" in option
        )
        model = ref.rsplit("/", 1)[-1]
        for example in examples.values():
            if model == "StreamCall":
                parse_call(example["value"])
            else:
                BODY_MODELS[model].model_validate(example["value"])
    assert with_body == 20


def test_links_name_operations_that_exist(document: dict[str, Any]) -> None:
    ids = {operation["operationId"] for _, operation in _operations(document)}
    linked = {
        link["operationId"]
        for _, operation in _operations(document)
        for answer in operation["responses"].values()
        for link in answer.get("links", {}).values()
    }
    assert {"get_run", "cancel_run", "show_alert", "show_limit"} <= linked <= ids


def test_the_codes_are_one_list_in_the_handlers_and_in_the_docs() -> None:
    """Every (status, code) the handlers can answer is in CODES, and docs/api.md's table
    lists exactly CODES."""
    answered = {(status, code) for status, code in _literal_answers()}
    answered |= {(CODES[code].status, code) for _, code in errors._SASFLOW_ERRORS}
    answered |= set(errors._STATUS_CODES.items())
    answered |= {(400, "invalid_json"), (500, "internal_error")}
    catalogue = {(code.status, name) for name, code in CODES.items()}
    assert answered <= catalogue
    unanswered = {name for _, name in catalogue - answered}
    assert unanswered == set(), "a code nothing answers"
    assert _documented_codes() == catalogue


def _literal_answers() -> Iterator[tuple[int, str]]:
    """(status, code) of every `ApiError(...)` and `error_response(...)` in engine/api."""
    for path in (REPO / "engine" / "api").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            callee = node.func
            name = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", "")
            status, code = node.args[0], node.args[1]
            if name in {"ApiError", "error_response"} and isinstance(status, ast.Constant):
                if isinstance(code, ast.Constant):
                    assert isinstance(status.value, int), (path, node.lineno)
                    assert isinstance(code.value, str), (path, node.lineno)
                    yield status.value, code.value
                else:  # a variable holding a code: checked where it is set
                    assert isinstance(code, ast.Name), (path, node.lineno)


def _documented_codes() -> set[tuple[int, str]]:
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    found = set()
    for line in section.splitlines():
        row = re.match(r"^\| (\d{3}) \| ([^|]+) \|", line)
        if row:
            found |= {(int(row[1]), code) for code in re.findall(r"`([a-z_]+)`", row[2])}
    return found
