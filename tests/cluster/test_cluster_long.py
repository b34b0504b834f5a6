"""The cluster tier's long form (SASFLOW_CLUSTER_LONG=1, `scripts/cluster test`): every node
lost in turn, the leaders of the submission and reply queues killed, queues deleted under their
consumers, failovers back and forth, each under load: nothing lost, no completion applied twice,
and the gap each fault left (printed)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from sasflow.transport.topology import Names
from tests.chaos.broker import connect
from tests.chaos.instances import RabbitInstance
from tests.cluster import fleet
from tests.cluster.app import AGENT
from tests.cluster.rabbit import RabbitCluster
from tests.private_services import PrivateCluster

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_long, pytest.mark.timeout(300)]


def test_killing_the_node_that_holds_the_fleet_queue_stops_nothing(
    rabbit: RabbitCluster, cluster_database: str, cluster_engine: Engine, cluster_names: Names
) -> None:
    """Every role declares the fleet queue (agent heartbeats) when it connects: on a node that
    is down, a classic queue cannot be declared (404 "home node ... is down"), and no role that
    reconnects could serve until that node is back."""
    with fleet.under_load(
        cluster_names,
        broker_url=rabbit.url,
        database_url=cluster_database,
        engine=cluster_engine,
        settle=45,
    ) as scenario:
        holder = _holder(rabbit, cluster_names.fleet)
        scenario.fault()
        holder.kill()  # and left down until every run completed
    print(f"\nSIGKILL of {holder.node}, holding the fleet queue: {scenario.summary()}")


def test_killing_the_node_that_holds_an_agents_breaker_queue_leaves_it_serving(
    rabbit: RabbitCluster, cluster_database: str, cluster_engine: Engine, cluster_names: Names
) -> None:
    """Each agent instance declares a queue of its own for its peers' breaker changes when it
    connects (classic, temporary by design): the loss of the node that holds it must not keep
    the instance, the only one here, from serving."""
    with fleet.under_load(
        cluster_names,
        broker_url=rabbit.url,
        database_url=cluster_database,
        engine=cluster_engine,
        settle=45,
        agents=1,
    ) as scenario:
        prefix = f"{cluster_names.breakers(AGENT)}."
        [queue] = [str(r["name"]) for r in rabbit.queues() if str(r["name"]).startswith(prefix)]
        holder = rabbit.home(queue)
        scenario.fault()
        holder.kill()
        # Whichever node its connection was on, the agent connects again now.
        closed = rabbit.close_connections("cluster-test-agent-1@")
    print(
        f"\nSIGKILL of {holder.node}, holding {queue}, and the agent's connection closed "
        f"({closed} left open by the kill): {scenario.summary()}"
    )


def _holder(rabbit: RabbitCluster, queue: str) -> RabbitInstance:
    row = next(r for r in rabbit.queues() if r["name"] == queue)
    return rabbit.leader(queue) if row["type"] == "quorum" else rabbit.home(queue)


@pytest.mark.parametrize("queue", ["submit", "replies"])
def test_killing_the_node_that_leads_a_shared_queue_loses_nothing(
    queue: str,
    rabbit: RabbitCluster,
    cluster_database: str,
    cluster_engine: Engine,
    cluster_names: Names,
) -> None:
    name = getattr(cluster_names, queue)
    with fleet.under_load(
        cluster_names, broker_url=rabbit.url, database_url=cluster_database, engine=cluster_engine
    ) as scenario:
        leader = rabbit.leader(name)
        scenario.fault()
        leader.kill()
    print(f"\nSIGKILL of {leader.node}, leader of {name}: {scenario.summary()}")
    assert rabbit.leader(name) is not leader


def test_killing_a_node_that_does_not_lead_the_agent_queue_keeps_its_leader(
    rabbit: RabbitCluster, cluster_database: str, cluster_engine: Engine, cluster_names: Names
) -> None:
    queue = cluster_names.agent(AGENT)
    with fleet.under_load(
        cluster_names, broker_url=rabbit.url, database_url=cluster_database, engine=cluster_engine
    ) as scenario:
        leader = rabbit.leader(queue)
        other = rabbit.other_than(leader)
        scenario.fault()
        other.kill()
    print(f"\nSIGKILL of {other.node}, not the agent queue's leader: {scenario.summary()}")
    assert rabbit.leader(queue) is leader


def test_every_node_lost_in_turn_loses_nothing(
    rabbit: RabbitCluster, cluster_database: str, cluster_engine: Engine, cluster_names: Names
) -> None:
    with fleet.under_load(
        cluster_names,
        broker_url=rabbit.url,
        database_url=cluster_database,
        engine=cluster_engine,
        runs=120,
        seconds=40,
    ) as scenario:
        scenario.fault()
        for node in rabbit.nodes:
            node.kill()
            time.sleep(3)
            node.boot()
    print(f"\neach node SIGKILLed for 3 s and booted again: {scenario.summary()}")


@pytest.mark.parametrize("queue", ["agent", "replies"])
def test_deleting_a_queue_under_its_consumers_loses_no_run(
    queue: str,
    rabbit: RabbitCluster,
    cluster_database: str,
    cluster_engine: Engine,
    cluster_names: Names,
) -> None:
    """The consumers are cancelled by the broker: they notice, declare the queue again and
    consume; the messages the queue held are gone, and their steps are dispatched again once
    their deadline passed."""
    name = cluster_names.agent(AGENT) if queue == "agent" else cluster_names.replies
    with fleet.under_load(
        cluster_names, broker_url=rabbit.url, database_url=cluster_database, engine=cluster_engine
    ) as scenario:
        scenario.fault()
        connection = connect(rabbit.url)
        try:
            connection.channel().queue_delete(name)
        finally:
            connection.close()
    print(f"\n{name} deleted under its consumers: {scenario.summary()}")


def test_failing_over_back_and_forth_loses_nothing(
    local_cluster: PrivateCluster,
    cluster_database: str,
    cluster_engine: Engine,
    cluster_names: Names,
) -> None:
    cluster = local_cluster.cluster
    pair = cluster.postgres
    first = pair.primary_name
    with fleet.under_load(
        cluster_names,
        broker_url=cluster.broker_url,
        database_url=cluster_database,
        engine=cluster_engine,
        runs=80,
        seconds=20,
    ) as scenario:
        scenario.fault()
        for _ in range(2):
            with pair.promoted():
                time.sleep(2.0)
            time.sleep(4.0)
    print(f"\ntwo failovers, each old primary fenced 2 s later: {scenario.summary()}")
    assert pair.primary_name == first
