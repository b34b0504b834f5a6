"""A run's workflow as a picture: each step placed in the column of its longest chain of
dependencies, drawn by the run page as inline SVG (no JavaScript)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

COLUMN_W = 170
ROW_H = 56
BOX_W = 140
BOX_H = 36
MARGIN = 8


@dataclass(frozen=True)
class Node:
    name: str
    state: str
    x: int
    y: int


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
    order: Sequence[str], dependencies: Mapping[str, Sequence[str]], states: Mapping[str, str]
) -> Picture:
    """Place the steps (`order` is topological): column = longest chain of dependencies before
    the step, row = its rank in that column; an edge from each dependency to its step."""
    column: dict[str, int] = {}
    for name in order:
        column[name] = 1 + max((column[d] for d in dependencies.get(name, ())), default=-1)
    rows: dict[int, int] = {}
    place: dict[str, tuple[int, int]] = {}
    for name in order:
        row = rows.get(column[name], 0)
        rows[column[name]] = row + 1
        place[name] = (MARGIN + column[name] * COLUMN_W, MARGIN + row * ROW_H)
    nodes = tuple(Node(n, states.get(n, "?"), *place[n]) for n in order)
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
    height = MARGIN * 2 + (max(rows.values(), default=1) - 1) * ROW_H + BOX_H
    return Picture(nodes, edges, width, height)
