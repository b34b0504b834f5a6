"""The import rules of the package (CONTRIBUTING.md, "What may import what"), checked on the
source: the store is the one door to SQL, agents never reach the database, and an agent's
`import sasflow.agents` stays light."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import code_map

REPO = Path(__file__).resolve().parents[2]


def _modules() -> Iterator[tuple[str, Path]]:
    return code_map.modules(REPO)


def _imports(path: Path) -> set[str]:
    return code_map.imports(path, "")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(importer: str, forbidden: str) -> list[str]:
    return [
        f"{module} imports {name}"
        for module, path in _modules()
        if _within(module, importer)
        for name in sorted(_imports(path))
        if _within(name, forbidden)
    ]


def _outside_store(forbidden: str) -> list[str]:
    return [
        f"{module} imports {name}"
        for module, path in _modules()
        if not _within(module, "sasflow.store")
        for name in sorted(_imports(path))
        if _within(name, forbidden)
    ]


def test_only_the_store_imports_sqlalchemy() -> None:
    assert _outside_store("sqlalchemy") == []


def test_only_the_store_imports_the_table_definitions() -> None:
    assert _outside_store("sasflow.store.schema") == []


def test_the_store_never_imports_the_transport() -> None:
    assert _violations("sasflow.store", "sasflow.transport") == []


@pytest.mark.parametrize("forbidden", ["sasflow.store", "sasflow.supervisor", "sqlalchemy"])
def test_agents_never_import_the_database_side(forbidden: str) -> None:
    assert _violations("sasflow.agents", forbidden) == []


def test_the_rules_see_real_imports() -> None:
    """Guards the checks above against finding nothing because they read nothing."""
    modules = dict(_modules())
    assert "sasflow.store.runs.queries" in modules
    assert "sqlalchemy" in _imports(modules["sasflow.store.runs.queries"])
    assert _violations("sasflow.store", "sqlalchemy") != []


def test_importing_the_agents_package_loads_no_database_library() -> None:
    code = (
        "import sys, sasflow.agents\n"
        "heavy = ('sqlalchemy', 'psycopg', 'pydantic_settings', 'alembic')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_importing_the_http_client_loads_no_database_library() -> None:
    """`from sasflow.client import Client` (the SDK) loads httpx, not the store's libraries."""
    code = (
        "import sys\n"
        "from sasflow.client import Client, StreamUpdate\n"
        "heavy = ('sqlalchemy', 'psycopg', 'pydantic_settings', 'alembic', 'httpx')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['httpx']"


def test_no_folder_imports_back_up() -> None:
    """The folders and root modules of the package import one another without a loop: a
    folder never imports a module that imports it back (tests/code_map.py draws the arrows;
    its output names the loop and the arrows inside it)."""
    assert code_map.loops(code_map.room_graph(REPO)) == []


def test_the_loop_check_sees_a_loop() -> None:
    """Guards the check above: a loop through three rooms, and one of two, are found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}}
    assert code_map.loops(graph) == [["a", "b", "c"], ["d", "e"]]
    assert code_map.loops({"a": {"b"}, "b": {"c"}}) == []
