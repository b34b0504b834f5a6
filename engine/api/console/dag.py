"""A run's workflow as a picture: each step placed in the column of its longest chain of
dependencies, drawn by the run page as inline SVG (no JavaScript). A step may carry a
`Decoration`: lines under its state (a map's items by state) and a link (where its details
are); what a kind of step shows is decided by its caller (run_view), not here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

COLUMN_W = 170
ROW_H = 56
BOX_W = 140
BOX_H = 36
MARGIN = 8
LINE_H = 14
"""The height of each line a decoration adds to its box."""


@dataclass(frozen=True)
class Decoration:
    """What a step's box shows besides its name and state."""

    lines: tuple[str, ...] = ()
    href: str | None = None
    title: str | None = None
    """The box's tooltip (all it says, when its lines are cut short)."""


@dataclass(frozen=True)
class Node:
    name: str
    state: str
    x: int
    y: int
    decoration: Decoration = Decoration()

    @property
    def height(self) -> int:
        return BOX_H + LINE_H * len(self.decoration.lines)


@dataclass(frozen=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Picture:
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


def layout(
    order: Sequence[str],
    dependencies: Mapping[str, Sequence[str]],
    states: Mapping[str, str],
    decorations: Mapping[str, Decoration] | None = None,
) -> Picture:
    """Place the steps (`order` is topological): column = longest chain of dependencies before
    the step, row = its rank in that column (a decorated box is taller: the rows below it move
    down); an edge from each dependency to its step."""
    decorations = decorations or {}
    column: dict[str, int] = {}
    for name in order:
        column[name] = 1 + max((column[d] for d in dependencies.get(name, ())), default=-1)
    tops: dict[int, int] = {}
    place: dict[str, tuple[int, int]] = {}
    for name in order:
        top = tops.get(column[name], MARGIN)
        extra = LINE_H * len(decorations.get(name, Decoration()).lines)
        tops[column[name]] = top + ROW_H + extra
        place[name] = (MARGIN + column[name] * COLUMN_W, top)
    nodes = tuple(
        Node(n, states.get(n, "?"), *place[n], decorations.get(n, Decoration())) for n in order
    )
    edges = tuple(
        Edge(
            place[d][0] + BOX_W,
            place[d][1] + BOX_H // 2,
            place[n][0],
            place[n][1] + BOX_H // 2,
        )
        for n in order
        for d in dependencies.get(n, ())
    )
    width = MARGIN * 2 + (max(column.values(), default=0)) * COLUMN_W + BOX_W
    height = MARGIN + max((n.y + n.height for n in nodes), default=MARGIN + BOX_H)
    return Picture(nodes, edges, width, height)
