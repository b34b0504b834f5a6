"""Print the package's code map figures (CONTRIBUTING.md, "Code map figures"): lines, modules,
module sizes, and the folder-level import loops that tests/unit/test_import_rules.py forbids.

Usage: python -m tests.code_map [CHECKOUT]   (default: this checkout)
"""

from __future__ import annotations

import ast
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGES = {"engine": "sasflow", "agents": "sasflow.agents", "supervisor": "sasflow.supervisor"}


def modules(repo: Path) -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of every module of the three installed folders."""
    for folder, package in PACKAGES.items():
        for path in sorted((repo / folder).rglob("*.py")):
            parts = path.relative_to(repo / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((package, *parts)), path


def imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports, wherever the statement stands (under TYPE_CHECKING and
    inside functions too; relative imports resolved); `from m import n` counts as m and m.n."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def room(name: str, packages: set[str]) -> str:
    """The node a module belongs to: its top folder below `sasflow` (agents and supervisor are
    folders of their own), a module of the package root, or the facade `sasflow` itself."""
    parts = name.split(".")
    if parts[:2] in (["sasflow", "agents"], ["sasflow", "supervisor"]):
        return ".".join(parts[:2])
    if len(parts) >= 2 and ".".join(parts[:2]) in packages:
        return ".".join(parts[:2])
    return ".".join(parts[:2]) if len(parts) >= 2 else "sasflow"


def room_graph(repo: Path) -> dict[str, set[str]]:
    """Folder-level import arrows: room -> rooms it imports (its own room left out)."""
    found = dict(modules(repo))
    packages = {name for name, path in found.items() if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        source = room(name, packages)
        for imported in imports(path, name):
            if imported != "sasflow" and not imported.startswith("sasflow."):
                continue
            target = imported
            while target not in found and "." in target:
                target = target.rpartition(".")[0]  # `from sasflow.x import Name`
            other = room(target, packages)
            if other != source:
                graph.setdefault(source, set()).add(other)
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of rooms (Tarjan): each one is an import loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def back_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Arrows that close a loop: inside a loop group, from a room to one that imports it."""
    arrows = []
    for group in loops(graph):
        members = set(group)
        arrows += [(a, b) for a in group for b in sorted(graph.get(a, ())) if b in members]
    return arrows


def main() -> None:
    repo = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    sizes = sorted(len(path.read_text(encoding="utf-8").splitlines()) for _, path in modules(repo))
    graph = room_graph(repo)
    print(f"package lines {sum(sizes)}, modules {len(sizes)}")
    print(
        f"module lines: median {statistics.median(sizes):.0f}, "
        f"p90 {sizes[int(0.9 * (len(sizes) - 1))]}, max {sizes[-1]}, "
        f"over 400: {sum(size > 400 for size in sizes)}"
    )
    groups = loops(graph)
    print(f"folder-level loops: {len(groups)}")
    for group in groups:
        print("  " + " <-> ".join(group))
    for a, b in back_arrows(graph):
        print(f"    {a} -> {b}")


if __name__ == "__main__":
    main()
