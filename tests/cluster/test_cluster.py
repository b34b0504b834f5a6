"""The cluster tier's CI form: work on quorum queues spread over three RabbitMQ nodes, the node
that leads the agent queue SIGKILLed under load, and the PostgreSQL standby promoted under load
with the old primary fenced: nothing lost, no completion applied twice, work resumed (the gap
each fault left is printed)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from sasflow.transport.topology import Names
from tests.cluster import fleet
from tests.cluster.app import AGENT
from tests.cluster.rabbit import RabbitCluster
from tests.private_services import PrivateCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_runs_complete_on_quorum_queues_spread_over_the_nodes(
    local_cluster: PrivateCluster,
    cluster_database: str,
    cluster_engine: Engine,
    cluster_names: Names,
) -> None:
    cluster = local_cluster.cluster
    with fleet.under_load(
        cluster_names,
        broker_url=cluster.broker_url,
        database_url=cluster_database,
        engine=cluster_engine,
        runs=10,
        seconds=1,
    ):
        pass
    queues = {str(row["name"]): row for row in cluster.rabbit.queues()}
    work = [cluster_names.submit, cluster_names.replies, cluster_names.agent(AGENT)]
    nodes = sorted(node.node for node in cluster.rabbit.nodes)
    for name in work:
        assert queues[name]["type"] == "quorum", name
        assert sorted(queues[name]["members"]) == nodes, name  # type: ignore[call-overload]
        assert sorted(queues[name]["online"]) == nodes, name  # type: ignore[call-overload]
    leaders = {name: queues[name]["leader"] for name in work}
    print(f"\nleaders: {leaders}")
    assert len(set(leaders.values())) > 1, "every work queue is led by one node"


def test_killing_the_node_that_leads_the_agent_queue_loses_nothing(
    rabbit: RabbitCluster, cluster_database: str, cluster_engine: Engine, cluster_names: Names
) -> None:
    queue = cluster_names.agent(AGENT)
    with fleet.under_load(
        cluster_names, broker_url=rabbit.url, database_url=cluster_database, engine=cluster_engine
    ) as scenario:
        leader = rabbit.leader(queue)
        scenario.fault()
        leader.kill()  # and left down until every run completed
    new_leader = rabbit.leader(queue)
    print(f"\nSIGKILL of {leader.node}, leader of the agent queue: {scenario.summary()}")
    assert new_leader is not leader
    assert scenario.gap().next_done is not None


def test_promoting_the_standby_under_load_loses_nothing(
    local_cluster: PrivateCluster,
    cluster_database: str,
    cluster_engine: Engine,
    cluster_names: Names,
) -> None:
    cluster = local_cluster.cluster
    pair = cluster.postgres
    old_primary = pair.primary_name
    with fleet.under_load(
        cluster_names,
        broker_url=cluster.broker_url,
        database_url=cluster_database,
        engine=cluster_engine,
    ) as scenario:
        scenario.fault()
        with pair.promoted():
            time.sleep(1.0)  # the old primary still runs: its commits wait for a standby
        fenced = time.time() - (scenario.fault_at or 0)
    print(
        f"\npromoted {pair.primary_name}; {old_primary} stopped and rebuilt as its standby "
        f"{fenced:.2f}s later: {scenario.summary()}"
    )
    assert pair.primary_name != old_primary
    assert scenario.gap().next_done is not None
