"""Fixtures shared by the integration and acceptance tests: each test gets its own database
(cloned from a migrated template) and its own SASFLOW_NAMESPACE on the real services."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import services


@pytest.fixture(scope="session")
def template_database() -> Iterator[str]:
    """A database migrated to head once per session; tests clone it."""
    name = services.unique("sasflow_tpl")
    services.create_database(name)
    engine = make_engine(services.database_url(name), pool_size=1)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    yield name
    services.drop_database(name)


@pytest.fixture
def database_url(template_database: str) -> Iterator[str]:
    name = services.unique("sasflow_test")
    services.create_database(name, template=template_database)
    yield services.database_url(name)
    services.drop_database(name)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture
def names() -> Iterator[Names]:
    names = Names(services.unique("sftest"))
    yield names
    services.delete_namespace(names.namespace, names.all_queues([]))


@pytest.fixture
def broker_url() -> str:
    return services.broker_url()
