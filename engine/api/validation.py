"""What the database can hold, checked at the door: every such input is a 422
`validation_error` naming its field, never a 500 from PostgreSQL (docs/api.md#errors).

- Ids and cursors are PostgreSQL `bigint`s (`RowId`, `Cursor`), counts and versions
  `integer`s (`INT_MAX`).
- No string may hold a NUL character (`\\u0000`): PostgreSQL's `text` and `jsonb` cannot store
  one. Paths and queries are checked by `refuse_nul` (a dependency of every `/v1` router), JSON
  bodies by `nul_fields` (called by the body limits middleware, which holds the raw body).
- A reason must carry text (`Reason`): at least one character that is neither blank nor a
  control character.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, Field

from sasflow.maps import MAX_ITEMS
from sasflow.ops.reasons import REASON_MAX, has_text

BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
NUL_MESSAGE = "a NUL character (\\u0000) cannot be stored"

RowId = Annotated[int, Path(ge=1, le=BIGINT_MAX)]
"""A row's id in a path."""
MapItemsShown = Annotated[
    int,
    Query(
        ge=0,
        le=MAX_ITEMS,
        description="How many items of each map step a run's detail lists under the map (in "
        "index order); the items are never listed as steps of their own.",
    ),
]
"""`map_items` of a run's detail (ops.map_items)."""
Cursor = Annotated[
    int | None, Query(ge=1, le=BIGINT_MAX, description="next_cursor of the last page")
]


def _has_text(value: str) -> str:
    if not has_text(value):
        raise ValueError("must contain text, not only blanks or control characters")
    return value


Reason = Annotated[str, Field(min_length=1, max_length=REASON_MAX), AfterValidator(_has_text)]
"""An operator's reason, audited."""
QueryReason = Annotated[
    str,
    Query(min_length=1, max_length=REASON_MAX, description="Why (audited)."),
    AfterValidator(_has_text),
]
"""The same, as a query parameter (`DELETE /v1/limits/{name}?reason=...`)."""


def refuse_nul(request: Request) -> None:
    """Refuse a path parameter or a query parameter (name or value) holding a NUL."""
    where = [("path", name) for name, value in request.path_params.items() if "\x00" in value]
    where += [
        ("query", name.replace("\x00", "\\u0000"))
        for name, value in request.query_params.multi_items()
        if "\x00" in name or "\x00" in value
    ]
    if where:
        raise RequestValidationError(
            [{"loc": loc, "msg": NUL_MESSAGE, "type": "nul_character"} for loc in where]
        )


def nul_problems(fields: list[str]) -> list[dict[str, str]]:
    """The `fields` of a 422 for NULs at these places."""
    return [{"field": f, "message": NUL_MESSAGE} for f in fields]


def nul_fields(body: bytes) -> list[str]:
    """Where a JSON body holds a NUL in a string or a key (`body.a.0.b`); [] for none, or for
    a body that is not JSON (its own error comes later)."""
    if b"\\u0000" not in body:  # JSON writes a NUL as \u0000: nothing else can hold one
        return []
    try:
        document = json.loads(body)
    except ValueError:
        return []
    return [".".join(("body", *path)) for path in _nuls(document, ())]


def _nuls(value: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    if isinstance(value, str):
        if "\x00" in value:
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                yield (*path, key.replace("\x00", "\\u0000"))
            else:
                yield from _nuls(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nuls(item, (*path, str(index)))
