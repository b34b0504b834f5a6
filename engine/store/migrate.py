"""Run the Alembic migrations shipped inside the package (works from a wheel or a checkout)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import Column, Engine, Index
from sqlalchemy.exc import DBAPIError

from alembic import command
from sasflow.errors import ConfigurationError, SchemaOutdatedError
from sasflow.store.db import sqlstate, translated
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


def downgrades(engine: Engine, revision: str) -> list[tuple[str, str]]:
    """The revisions `downgrade(engine, revision)` would undo, newest first, each with its
    message; empty when the database is at or below `revision` already. Raises
    ConfigurationError for a revision this sasflow does not know."""
    at = current(engine)
    if at is None:
        return []
    script = ScriptDirectory.from_config(_config())
    try:
        target = None if revision == "base" else script.get_revision(revision)
        undone = list(script.iterate_revisions(at, revision if target is not None else "base"))
    except (CommandError, RevisionError) as exc:
        raise ConfigurationError(f"cannot downgrade from {at} to {revision!r}: {exc}") from exc
    stop = None if target is None else target.revision
    return [
        (r.revision, (r.doc or "").splitlines()[0] if r.doc else "")
        for r in undone
        if r.revision != stop
    ]


@dataclass(frozen=True)
class SchemaStatus:
    """The database's revision against this sasflow's head."""

    current: str | None
    """The database's revision; None: never migrated (or downgraded to base)."""
    head: str | None
    known: bool
    """Whether `current` is one of this sasflow's revisions (False: a newer sasflow's)."""
    unreadable: str | None = None
    """Why the revision could not be read (this role may not read `alembic_version`): then
    nothing is known of it, and nothing is refused for it."""

    @property
    def at_head(self) -> bool:
        return self.unreadable is None and self.current == self.head

    @property
    def behind(self) -> bool:
        """Empty, or at an older revision of this sasflow: its statements may fail."""
        return self.unreadable is None and not self.at_head and (self.current is None or self.known)

    @property
    def ahead(self) -> bool:
        """At a revision this sasflow does not know: a newer sasflow migrated it (upgrades
        migrate before they restart the processes, so the old ones keep running on it)."""
        return self.current is not None and not self.known

    def sentence(self) -> str:
        """What `sasflow db check` says of it."""
        if self.unreadable is not None:
            return f"the database's revision cannot be read ({self.unreadable}): not checked"
        if self.ahead:
            return (
                f"database at {self.current}, which this sasflow does not know (its head is "
                f"{self.head}): a newer sasflow migrated it"
            )
        at = self.current or "(empty)"
        return f"database at {at}, head is {self.head}: run `sasflow db upgrade`"


def schema_status(engine: Engine) -> SchemaStatus:
    """Read the database's revision (one short connection) and place it against the head."""
    script = ScriptDirectory.from_config(_config())
    top = script.get_current_head()
    try:
        at = current(engine)
    except DBAPIError as exc:
        if sqlstate(exc) != "42501":  # insufficient privilege: grants narrower than roles.sql
            raise
        reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else "denied"
        return SchemaStatus(current=None, head=top, known=True, unreadable=reason)
    known = True
    if at is not None and at != top:
        try:
            known = script.get_revision(at) is not None
        except (CommandError, RevisionError):
            known = False
    return SchemaStatus(current=at, head=top, known=known)


def require_head(engine: Engine) -> SchemaStatus:
    """The schema's status when the database is at head or ahead of it; raises
    SchemaOutdatedError (its sentence) when it is empty or behind, and the store's errors when
    the database cannot be reached or refuses the connection."""
    status = schema_status(engine)
    if status.behind:
        raise SchemaOutdatedError(status.sentence())
    return status


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
