"""Which arguments declare a queue: the deployment's type for work queues, classic by name
for the others, and the quorum-only arguments only on quorum queues."""

from __future__ import annotations

from sasflow.settings import Settings
from sasflow.transport.queues import (
    DEFAULT_DELIVERY_LIMIT,
    QueueOptions,
    QueueType,
    queue_arguments,
    type_mismatch,
)

QUORUM = QueueOptions(type=QueueType.QUORUM, replicas=3, delivery_limit=5)


def test_classic_work_queues_name_their_type_and_nothing_quorum() -> None:
    assert queue_arguments(QueueOptions(), work=True, dead_letter_exchange="ns.dlx") == {
        "x-queue-type": "classic",
        "x-dead-letter-exchange": "ns.dlx",
    }


def test_quorum_work_queues_dead_letter_at_least_once_with_a_delivery_limit() -> None:
    assert queue_arguments(QUORUM, work=True, dead_letter_exchange="ns.dlx") == {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "ns.dlx",
        "x-quorum-initial-group-size": 3,
        "x-delivery-limit": 5,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def test_a_bounded_quorum_queue_drops_its_oldest() -> None:
    arguments = queue_arguments(QUORUM, work=True, dead_letter_exchange=None, max_length=10)
    assert arguments["x-overflow"] == "drop-head"
    assert "x-dead-letter-strategy" not in arguments


def test_temporary_queues_stay_classic_whatever_the_setting() -> None:
    arguments = queue_arguments(
        QUORUM, work=False, dead_letter_exchange=None, max_length=10, expires_ms=60_000
    )
    assert arguments == {
        "x-queue-type": "classic",
        "x-max-length": 10,
        "x-overflow": "drop-head",
        "x-expires": 60_000,
    }


def test_no_delivery_limit_when_unset() -> None:
    options = QueueOptions(type=QueueType.QUORUM, delivery_limit=None)
    assert "x-delivery-limit" not in queue_arguments(options, work=True, dead_letter_exchange=None)


def test_type_mismatch_names_only_the_type_arguments() -> None:
    assert type_mismatch(
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/'"
    )
    assert not type_mismatch(
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q'"
    )


def test_the_setting_defaults_to_the_transport_default() -> None:
    assert Settings().broker_delivery_limit == DEFAULT_DELIVERY_LIMIT
    assert QueueType(Settings().broker_queue_type) is QueueType.CLASSIC
