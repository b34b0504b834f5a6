"""Fixtures shared by the integration and acceptance tests: each test gets its own database
(cloned from a migrated template) and its own SASFLOW_NAMESPACE on the real services.

The roles connect as they would in production: the template is created by the shipped
deploy/postgresql/roles.sql and migrated by its owner role, and `database_url` and `engine`
connect as the runtime role (DML only), so a grant the roles miss fails the tests. A test that
needs a superuser (ALTER DATABASE, ending other roles' sessions) takes `admin_database_url`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine

from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import services
from tests.databases import DatabasePool, pool

CLUSTER_LONG = "SASFLOW_CLUSTER_LONG"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster tier's long form (marked `cluster_long`) runs only when asked for."""
    if os.environ.get(CLUSTER_LONG) == "1":
        return
    skip = pytest.mark.skip(
        reason=f"the cluster tier's long form: {CLUSTER_LONG}=1 (scripts/cluster test)"
    )
    for item in items:
        if item.get_closest_marker("cluster_long") is not None:
            item.add_marker(skip)


@dataclass(frozen=True)
class DatabaseRoles:
    """This session's roles (unique names: sessions of other worktrees share the server)."""

    owner: str
    runtime: str
    readonly: str


@pytest.fixture(scope="session")
def database_roles() -> Iterator[DatabaseRoles]:
    roles = DatabaseRoles(
        owner=services.unique("sf_owner"),
        runtime=services.unique("sf_runtime"),
        readonly=services.unique("sf_readonly"),
    )
    yield roles
    services.drop_roles(roles.runtime, roles.readonly, roles.owner)


@pytest.fixture(scope="session")
def template_database(database_roles: DatabaseRoles) -> Iterator[str]:
    """A database migrated to head by the owner role once per session; tests clone it."""
    name = services.unique("sasflow_tpl")
    try:
        services.apply_roles_script(
            name,
            owner=database_roles.owner,
            runtime=database_roles.runtime,
            readonly=database_roles.readonly,
        )
        engine = make_engine(services.database_url(name, user=database_roles.owner), pool_size=1)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        yield name
    finally:
        services.drop_database(name)


@pytest.fixture(scope="session")
def databases(template_database: str, database_roles: DatabaseRoles) -> Iterator[DatabasePool]:
    """Clones of the template, made ahead of the tests and dropped after them in the
    background (tests/databases.py). The clone keeps the template's grants and default
    privileges (they live in the database); its owner is named again since CREATE DATABASE
    makes the admin own it."""
    with pool(template_database, database_roles.owner) as made:
        yield made


@pytest.fixture(scope="module")
def module_database(databases: DatabasePool, database_roles: DatabaseRoles) -> Iterator[str]:
    """A database for a whole module (cloned from the template), as the runtime role: for
    modules that share one slow-to-start server."""
    name = databases.take()
    yield services.with_user(services.database_url(name), database_roles.runtime)
    databases.give_back(name)


@pytest.fixture
def admin_database_url(databases: DatabasePool) -> Iterator[str]:
    """This test's own database, as the superuser: for what no sasflow role may do."""
    name = databases.take()
    yield services.database_url(name)
    databases.give_back(name)


@pytest.fixture
def database_url(admin_database_url: str, database_roles: DatabaseRoles) -> str:
    """This test's own database, as the runtime role the sasflow processes use."""
    return services.with_user(admin_database_url, database_roles.runtime)


@pytest.fixture
def owner_database_url(admin_database_url: str, database_roles: DatabaseRoles) -> str:
    """This test's own database, as the owner role that migrations (sasflow's and an app's
    own) run as: what it creates, the runtime role may read and write."""
    return services.with_user(admin_database_url, database_roles.owner)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def module_engine(module_database: str) -> Iterator[Engine]:
    """An engine on `module_database`, for the modules that share one server."""
    engine = make_engine(module_database, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def broker_namespaces() -> Iterator[set[str]]:
    """The namespaces this session's tests used; what they left goes in one sweep at the end."""
    used: set[str] = set()
    yield used
    services.delete_namespaces(used)


@pytest.fixture
def names(broker_namespaces: set[str]) -> Iterator[Names]:
    names = Names(services.unique("sftest"))
    broker_namespaces.add(names.namespace)
    yield names
    services.delete_known(names)


@pytest.fixture
def broker_url() -> str:
    return services.broker_url()


@pytest.fixture(autouse=True)
def _logger_levels() -> Iterator[None]:
    """A one-shot `sasflow` command run in this process (CliRunner) quiets the broker's
    loggers, as its own process would for its whole (short) life: put them back after each
    test, so that no later test's caplog loses their records."""
    import logging  # noqa: PLC0415 - only this fixture

    from sasflow.cli.context import BROKER_LOGGERS  # noqa: PLC0415

    levels = {name: logging.getLogger(name).level for name in ("alembic", *BROKER_LOGGERS)}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
