"""Render operator output as a table (rich) or JSON, the same data either way."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

OUTPUT_OPTION = click.option(
    "-o",
    "--output",
    "output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=_default, ensure_ascii=False)


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def cell(value: Any, width: int = 60) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    text = value if isinstance(value, str) else json.dumps(value, default=_default)
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(*columns, title=title, title_justify="left")
    for row in rows:
        table.add_row(*(cell(v) for v in row))
    Console().print(table)


def parse_moment(text: str | None) -> datetime | float | None:
    """`15m`, `2h`, `3d`, `90s` (before the database's now), or an ISO-8601 time (UTC if
    no offset is given)."""
    if text is None:
        return None
    match = _RELATIVE.match(text.strip())
    if match:
        return float(match.group(1)) * _UNITS[match.group(2)]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration like 15m/2h/3d nor an ISO-8601 time"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
