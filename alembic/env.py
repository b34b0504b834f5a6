"""Alembic environment for sasflow's state store.

`sasflow db upgrade` passes an open connection in `config.attributes["connection"]`; run from a
checkout with `alembic` directly, the URL comes from SASFLOW_DATABASE_URL. On SQLite, which
alters tables only by copying them, autogenerate renders batch operations.
"""

from __future__ import annotations

import os

from sqlalchemy import Connection

from alembic import context
from sasflow.store.db import EngineOptions, make_engine
from sasflow.store.migrate import include_object
from sasflow.store.schema import metadata

config = context.config


def _configure_and_run(connection: Connection) -> None:
    dialect = connection.dialect.name
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        include_object=include_object(dialect),
        render_as_batch=dialect == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    url = os.environ.get("SASFLOW_DATABASE_URL")
    if not url:
        raise SystemExit("set SASFLOW_DATABASE_URL (or use `sasflow db upgrade`)")
    engine = make_engine(
        url,
        EngineOptions(
            application_name="sasflow-alembic",
            pool_size=1,
            max_overflow=0,
            statement_timeout_ms=None,
        ),
    )
    with engine.connect() as conn:
        _configure_and_run(conn)
    engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=os.environ.get("SASFLOW_DATABASE_URL"), target_metadata=metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
