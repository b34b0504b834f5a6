"""A limit's key as SQL: the text a step's run gives its key expression (store/flow/model.py),
the same on PostgreSQL and SQLite for strings and integers (the values keys are made of), at
most KEY_LENGTH characters, '' when the run's input lacks the field."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, String, cast, func, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.visitors import InternalTraversal

from sasflow.store.flow.model import KeyExpr, KeyKind
from sasflow.store.schema import runs

KEY_LENGTH = 200
"""flow_buckets.key's length: longer keys are cut there."""


class _InputText(ColumnElement[str]):
    """The value at `path` of the run's input as text (NULL when missing). The path's fields
    are validated (KeyExpr.parse: letters, digits, '_', '-'), so they are written in the SQL."""

    inherit_cache = True
    type = String()
    _traverse_internals = [("path", InternalTraversal.dp_string_list)]  # noqa: RUF012

    def __init__(self, path: tuple[str, ...]) -> None:
        self.path = list(path)


@compiles(_InputText)
def _input_text_default(element: _InputText, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(runs.c.input, **kw)
    return f"({column} #>> '{{{','.join(element.path)}}}')"


@compiles(_InputText, "sqlite")
def _input_text_sqlite(element: _InputText, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(runs.c.input, **kw)
    path = "$" + "".join(f'."{field}"' for field in element.path)
    return f"CAST(json_extract({column}, '{path}') AS TEXT)"


def key_value(expr: KeyExpr) -> ColumnElement[str]:
    """The key of a step's run under `expr` (the statement joins `runs`)."""
    if expr.kind == KeyKind.BUSINESS_KEY:
        value: ColumnElement[Any] = runs.c.business_key
    elif expr.kind == KeyKind.WORKFLOW:
        value = runs.c.workflow
    else:
        value = _InputText(expr.path)
    return func.substr(func.coalesce(cast(value, String), literal("")), 1, KEY_LENGTH)
