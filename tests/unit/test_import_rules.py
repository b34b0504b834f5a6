"""The import rules of the package (CONTRIBUTING.md, "What may import what"), checked on the
source: the store is the one door to SQL, agents never reach the database, and an agent's
`import sasflow.agents` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"engine": "sasflow", "agents": "sasflow.agents", "supervisor": "sasflow.supervisor"}


def _modules() -> Iterator[tuple[str, Path]]:
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((package, *parts)), path


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, wherever the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


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
    assert "sasflow.store.queries" in modules
    assert "sqlalchemy" in _imports(modules["sasflow.store.queries"])
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
