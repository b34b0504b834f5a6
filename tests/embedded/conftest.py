"""Fixtures of the embedded state store: each test gets its own SQLite file, copied from one
migrated once per session (the SQLite twin of tests/conftest.py's template database)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sasflow.store import migrate
from sasflow.store.db import make_engine


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    engine = make_engine(f"sqlite:///{path}", pool_size=1)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()  # the last connection to close checkpoints the WAL into the file
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "sasflow.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url, application_name="sasflow-test", pool_size=8)
    yield engine
    engine.dispose()
