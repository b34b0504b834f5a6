"""The OpenAPI document at `/openapi.json`, exact about errors: each operation lists every
status it can answer, each error with the one error schema (`ErrorResponse`, not FastAPI's
`{"detail": [...]}`) narrowed to the codes (codes.py) that status can carry there.

Routes name their errors with `answers(...)`; `install` completes the document with the
schemas that no route names as a model (the error shapes, the stream's calls). The bearer
scheme and each operation's scope come from `auth.require`.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.json_schema import models_json_schema

from sasflow.api.codes import CODES
from sasflow.api.responses import BacklogFullResponse
from sasflow.api.stream.calls import StreamCall

SCHEMAS = "#/components/schemas/"
REF = SCHEMAS + "{model}"

AUTH = ("unauthorized", "invalid_token", "forbidden")
"""What any operation that needs a token may answer."""
ANY = ("validation_error",)
"""What any operation may answer: a path or a query the database cannot hold (a NUL) is a
422 wherever it is."""
STORE = ("store_unavailable",)
"""What an operation that reads or writes the database may answer."""
BODY = (
    "invalid_json",
    "too_deeply_nested",
    "request_timeout",
    "body_too_large",
    "validation_error",
)
"""What the body limits answer for an operation that takes a body (body.BodyLimits)."""

_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": 'The scheme to use: `Bearer realm="sasflow"`.',
            "required": True,
            "schema": {"type": "string"},
        }
    },
    429: {
        "Retry-After": {
            "description": "Seconds to wait before submitting again.",
            "required": True,
            "schema": {"type": "integer"},
        }
    },
}
_MODEL_OF_STATUS = {429: BacklogFullResponse.__name__}
_EXAMPLE_EXTRA: dict[str, dict[str, Any]] = {
    "unknown_workflow": {"known": ["order"]},
    "backlog_full": {"workflow": "order", "backlog": 10000, "max_backlog": 10000, "retry_after": 5},
}


class FieldProblem(BaseModel):
    field: str = Field(
        description="Where: `body.priority`, `body.input.items.0.name`, `path.run_id`, `query.key`."
    )
    message: str


class ErrorResponse(BaseModel):
    """Every error answer (docs/api.md#errors): `error`, a stable code for programs, and
    `message`, for people. A 422 adds `fields`; a few codes add keys of their own
    (`unknown_workflow`: `known`)."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="A stable code (docs/api.md#errors).")
    message: str
    fields: list[FieldProblem] = Field(
        default_factory=list, description="422 `validation_error`: one entry per problem."
    )


def answers(
    *codes: str, body: bool = False, token: bool = True, store: bool = True
) -> dict[int | str, Any]:
    """The error answers (`responses=` of a route) of an operation that can answer `codes`,
    with those of every operation (`ANY`), of a token (`AUTH`), of the database (`STORE`)
    and of a body (`BODY`). A token is checked in the database: `token` implies `store`."""
    chosen = (
        *codes,
        *ANY,
        *(AUTH if token else ()),
        *(STORE if store or token else ()),
        *(BODY if body else ()),
    )
    unique = sorted(dict.fromkeys(chosen), key=lambda code: CODES[code].status)
    return {
        status: _answer(status, list(group))
        for status, group in groupby(unique, key=lambda code: CODES[code].status)
    }


def _answer(status: int, codes: list[str]) -> dict[str, Any]:
    schema: dict[str, Any]
    if status in _MODEL_OF_STATUS:  # a model of its own, for its one code
        schema = {"$ref": SCHEMAS + _MODEL_OF_STATUS[status]}
    else:
        narrowed: dict[str, Any] = {"properties": {"error": {"enum": codes}}}
        if status == 422:
            narrowed["required"] = ["fields"]
        schema = {"allOf": [{"$ref": SCHEMAS + "ErrorResponse"}, narrowed]}
    answer: dict[str, Any] = {
        "description": "; ".join(f"`{code}`: {CODES[code].when}" for code in codes),
        "content": {
            "application/json": {
                "schema": schema,
                "examples": {code: {"value": _example(code)} for code in codes},
            }
        },
    }
    if status in _HEADERS:
        answer["headers"] = _HEADERS[status]
    return answer


def _example(code: str) -> dict[str, Any]:
    example: dict[str, Any] = {"error": code, "message": CODES[code].example}
    example.update(_EXAMPLE_EXTRA.get(code, {}))
    if code == "validation_error":
        field, _, message = CODES[code].example.partition(": ")
        example["fields"] = [{"field": field, "message": message}]
    return example


def link(operation: str, description: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link from an answer to the operation `operation` (its operationId, the
    route's function name), its `parameters` taken from the answer (`$response.body#/id`)."""
    return {"operationId": operation, "description": description, "parameters": parameters}


def operation_id(route: APIRoute) -> str:
    """An operation's id: its route's function name (`submit_run`, `get_run`), what generated
    clients call their methods."""
    return route.name


def install(app: FastAPI) -> None:
    """Complete `app`'s document with the schemas the answers refer to."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        document = build()
        if fresh:
            document.setdefault("components", {}).setdefault("schemas", {}).update(schemas())
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def schemas() -> dict[str, Any]:
    """The component schemas no route names as a model: the error shapes and the calls of
    the subscription stream (`StreamCall`, one of its five `type`s)."""
    _, models = models_json_schema(
        [(ErrorResponse, "validation"), (BacklogFullResponse, "validation")], ref_template=REF
    )
    found: dict[str, Any] = dict(models.get("$defs", {}))
    call = TypeAdapter(StreamCall).json_schema(ref_template=REF)
    found.update(call.pop("$defs", {}))
    found["StreamCall"] = {"title": "StreamCall", **call}
    return found
