"""The cluster tier: tests marked `cluster` run on the local cluster (three RabbitMQ nodes, a
PostgreSQL primary and its synchronous standby), the session's own, started once and removed
at its end, or the one SASFLOW_TEST_CLUSTER names (started by `scripts/cluster start`: taken
over, and left running with every node up). Without root or the PostgreSQL and RabbitMQ
binaries there is no cluster, and the tier is skipped.

The CI form is the tests marked `cluster` alone; the long form adds those marked
`cluster_long`, run when SASFLOW_CLUSTER_LONG=1 (`scripts/cluster test`; tests/conftest.py
skips them otherwise)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import private_services, services
from tests.chaos.instances import unavailable
from tests.cluster.__main__ import TEST_CLUSTER
from tests.cluster.rabbit import RabbitCluster


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[private_services.PrivateCluster]:
    running = os.environ.get(TEST_CLUSTER)
    if not running and (why := unavailable()) is not None:
        pytest.skip(f"no local cluster: {why} (scripts/cluster installs the binaries)")
    with private_services.cluster(Path(running) if running else None) as cluster:
        yield cluster


@pytest.fixture
def rabbit(local_cluster: private_services.PrivateCluster) -> RabbitCluster:
    """The RabbitMQ nodes (a node a test killed is booted again when its namespace goes)."""
    return local_cluster.cluster.rabbit


@pytest.fixture
def cluster_database(local_cluster: private_services.PrivateCluster) -> Iterator[str]:
    """This test's own database on the cluster: its multi-host URL, as the runtime role."""
    url = local_cluster.new_database()
    yield url
    local_cluster.drop_database(url)


@pytest.fixture
def cluster_engine(cluster_database: str) -> Iterator[Engine]:
    engine = make_engine(cluster_database, application_name="sasflow-cluster-test")
    yield engine
    engine.dispose()


@pytest.fixture
def cluster_names(local_cluster: private_services.PrivateCluster) -> Iterator[Names]:
    """This test's namespace. At its end every node the test killed is booted again, then the
    namespace's queues and exchanges are deleted."""
    names = Names(services.unique("sfcluster"))
    yield names
    local_cluster.cluster.rabbit.heal()
    local_cluster.cluster.rabbit.delete_namespace(names.namespace)
