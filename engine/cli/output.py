"""Render operator output as a table (rich) or JSON, the same data either way.

Tables stay readable on an 80-column terminal and when piped (rich then lays out for
$COLUMNS, else 80): no cell is cut with an ellipsis (long text folds onto more lines), times
are compact (`11-25 09:12:04`, UTC), errors read "step: Type: message", and when even the
narrowest layout does not fit, the columns each table declares droppable go first, in its
order, and the table's caption names them (`-o json` has every field whole).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

import click
from rich.cells import cell_len
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


JSON_CELL_CHARS = 200
"""A JSON value (not a text) in a table is cut after this many characters (`-o json` and the
`show` commands have it whole)."""


def cell(value: Any, width: int = JSON_CELL_CHARS) -> str:
    """`value` as a table shows it: text whole, a time to the second, other values as JSON
    cut at `width` characters."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, str):
        return value
    text = json.dumps(value, default=_default, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def compact_time(moment: datetime, now: datetime | None = None) -> str:
    """`11-25 09:12:04` (UTC) when `moment` is in the year of `now` (the database's clock),
    else `2025-11-25 09:12:04`: the year only when it is not this one (or unknown)."""
    at = moment.astimezone(UTC) if moment.tzinfo else moment
    if now is not None and at.year == (now.astimezone(UTC) if now.tzinfo else now).year:
        return at.strftime("%m-%d %H:%M:%S")
    return at.strftime("%Y-%m-%d %H:%M:%S")


def error_text(error: Any) -> str:
    """An error as stored (docs/protocol.md 7.3) as one line: "Type: message" for a step's,
    "step: Type: message" for a run's that names its step (marked "(compensation)" when a
    compensating step failed); any other JSON as it is."""
    if error is None:
        return ""
    if isinstance(error, dict):
        if "step" in error and "error" in error:
            mark = " (compensation)" if error.get("compensation") else ""
            return f"{error['step']}{mark}: {error_text(error['error'])}"
        if "message" in error:
            kind = error.get("type")
            return f"{kind}: {error['message']}" if kind else str(error["message"])
    return error if isinstance(error, str) else json.dumps(error, default=_default)


@dataclass(frozen=True)
class Column:
    """A table's column. `drop`: when the table does not fit the terminal, droppable columns
    go in increasing `drop` order (None: always shown). `wrap=False` for short values that
    must read whole on one line (ids, times, states); the others fold."""

    name: str
    drop: int | None = None
    wrap: bool = True
    justify: Literal["left", "right"] = "left"


def print_table(
    title: str | None,
    columns: Sequence[str | Column],
    rows: Sequence[Sequence[Any]],
    *,
    now: datetime | None = None,
) -> None:
    """Print `rows` under `columns` to fit the terminal (see the module's docstring); times
    compact against `now`, the database's clock, when given."""
    console = Console()
    console.print(fit_table(console, title, columns, rows, now=now))


def fit_table(
    console: Console,
    title: str | None,
    columns: Sequence[str | Column],
    rows: Sequence[Sequence[Any]],
    *,
    now: datetime | None = None,
) -> Table:
    """The table at `console`'s width: each column as wide as its longest value if they all
    fit; else each at its narrowest (a column that folds no narrower than its longest word,
    up to FOLD_MIN), the room left shared among the folding ones; droppable columns dropped
    while even that does not fit."""
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    texts = [
        [compact_time(v, now) if isinstance(v, datetime) else cell(v) for v in row] for row in rows
    ]
    shown = list(range(len(cols)))
    droppable = sorted(
        (i for i, c in enumerate(cols) if c.drop is not None), key=lambda i: cols[i].drop or 0
    )
    # A column of times only never wraps (a time cut in two reads as two).
    cols = [
        replace(c, wrap=False)
        if c.wrap
        and any(row[i] is not None for row in rows)
        and all(row[i] is None or isinstance(row[i], datetime) for row in rows)
        else c
        for i, c in enumerate(cols)
    ]
    while True:
        widths = _widths(console.width, cols, texts, shown)
        if widths is not None or not droppable:
            break
        shown.remove(droppable.pop(0))
    table = Table(title=title, title_justify="left")
    for n, i in enumerate(shown):
        col = cols[i]
        table.add_column(
            col.name,
            justify=col.justify,
            no_wrap=not col.wrap,
            overflow="fold",
            width=None if widths is None else widths[n],
        )
    for row in texts:
        table.add_row(*(row[i] for i in shown))
    hidden = [c.name for i, c in enumerate(cols) if i not in shown]
    if hidden:
        table.caption = f"not shown at {console.width} columns: {', '.join(hidden)} (see -o json)"
        table.caption_justify = "left"
    return table


FOLD_MIN = 24
"""A folding column is no narrower than its longest word up to this many characters (a longer
word, a URL, folds)."""


def _widths(
    width: int, cols: list[Column], texts: list[list[str]], shown: list[int]
) -> list[int] | None:
    """The widths of the `shown` columns' text in `width` characters (box and padding: three
    per column and one), or None when even their narrowest do not fit."""
    room = width - (3 * len(shown) + 1)
    natural: list[int] = []
    narrowest: list[int] = []
    for i in shown:
        values = [cols[i].name, *(row[i] for row in texts)]
        lines = [line for value in values for line in value.splitlines() or [""]]
        longest = max(cell_len(line) for line in lines)
        natural.append(longest)
        if not cols[i].wrap:
            narrowest.append(longest)
            continue
        word = max((cell_len(w) for line in lines for w in line.split()), default=1)
        narrowest.append(min(longest, word, FOLD_MIN))
    if sum(natural) <= room:
        return natural
    if sum(narrowest) > room:
        return None
    # The room left over, shared among the folding columns by how much more they would take.
    spare = room - sum(narrowest)
    wants = [nat - low for nat, low in zip(natural, narrowest, strict=True)]
    total = sum(wants)
    given = [spare * want // total for want in wants]
    for n in sorted(range(len(wants)), key=lambda n: wants[n] - given[n], reverse=True)[
        : spare - sum(given)
    ]:
        given[n] += 1
    return [low + extra for low, extra in zip(narrowest, given, strict=True)]


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
