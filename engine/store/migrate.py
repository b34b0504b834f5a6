"""Run the Alembic migrations shipped inside the package (works from a wheel or a checkout)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from io import StringIO
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Engine, Index

from alembic import command
from sasflow.errors import ConfigurationError
from sasflow.store.db import translated
from sasflow.store.schema import metadata


def script_location() -> str:
    """The folder holding env.py and versions/, wherever sasflow is installed.

    A wheel, an sdist and a strict editable install ship `alembic/` as the namespace package
    `sasflow.migrations`. A plain (lenient) editable install cannot import it: setuptools'
    editable finder maps a namespace package only below another namespace package, and
    `sasflow` is a regular one. There `sasflow` is imported from the checkout's `engine/`, so
    the migrations are the checkout's `alembic/`, next to it.
    """
    try:
        spec = importlib.util.find_spec("sasflow.migrations")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return str(next(iter(spec.submodule_search_locations)))
    checkout = Path(__file__).resolve().parents[2] / "alembic"
    if (checkout / "env.py").is_file() and (checkout / "versions").is_dir():
        return str(checkout)
    raise ConfigurationError(
        "the sasflow.migrations package is missing from this install "
        f"(nor is there a checkout's alembic/ folder at {checkout})"
    )


def _config() -> Config:
    cfg = Config(stdout=StringIO())
    cfg.set_main_option("script_location", script_location())
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    with translated(engine), engine.begin() as conn:
        cfg = _config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    with translated(engine), engine.begin() as conn:
        cfg = _config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def current(engine: Engine) -> str | None:
    """The database's revision, or None for an empty database."""
    with translated(engine), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def differences(engine: Engine) -> list[object]:
    """What autogenerate would change to make the database match the models (empty: none)."""
    with translated(engine), engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_object": include_object(conn.dialect.name)}
        )
        return list(compare_metadata(context, metadata))


IncludeObject = Callable[[object, str | None, str, bool, object | None], bool]


def include_object(dialect_name: str) -> IncludeObject:
    """Autogenerate's filter. SQLite's reflection cannot read an index's expressions back
    (ix_steps_ready's `priority DESC`), so there such an index is compared by name only (an
    extra one is still a difference; a missing one Alembic skips with a warning)."""

    def include(
        obj: object,
        name: str | None,  # noqa: ARG001 - Alembic's hook
        type_: str,
        reflected: bool,
        compare_to: object | None,
    ) -> bool:
        changed = type_ == "index" and not reflected and compare_to is not None
        return not (
            changed
            and dialect_name == "sqlite"
            and isinstance(obj, Index)
            and any(not isinstance(e, Column) for e in obj.expressions)
        )

    return include
