"""Choose the Transport implementation from the broker URL's scheme."""

from __future__ import annotations

from sasflow.errors import ConfigurationError
from sasflow.settings import Settings
from sasflow.transport.base import Transport
from sasflow.transport.brokers import AMQP_SCHEMES, MEMORY_SCHEME, broker_urls, scheme
from sasflow.transport.connection import BrokerOptions
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.queues import QueueOptions, QueueType
from sasflow.transport.rabbitmq import RabbitMQTransport
from sasflow.urllist import split_urls


def is_in_process(url: str) -> bool:
    """True for `memory://`: the transport only connects roles inside one process."""
    entries = split_urls(url)
    return len(entries) == 1 and scheme(entries[0]) == MEMORY_SCHEME


def make_transport(
    url: str,
    *,
    process_name: str,
    broker: MemoryBroker | None = None,
    options: BrokerOptions | None = None,
) -> Transport:
    """A new, unconnected transport for `url` (one broker URL, or a comma-separated list of
    RabbitMQ nodes); `memory://` needs the process's MemoryBroker. `options` (heartbeat,
    timeouts, TLS files) apply to RabbitMQ only, to each URL of the list.
    ConfigurationError names the first bad entry."""
    entries = broker_urls(url)
    if scheme(entries[0]) in AMQP_SCHEMES:
        return RabbitMQTransport(url, process_name=process_name, options=options)
    if broker is None:
        raise ConfigurationError(
            f"broker URL {url!r} names the in-process bus, but no MemoryBroker was given: "
            "the roles sharing it must run in one process and be handed the same broker"
        )
    return MemoryTransport(broker, process_name=process_name)


def broker_options(settings: Settings) -> BrokerOptions:
    """The RabbitMQ connection settings of every role (and of the demo's shop front)."""
    blocked = settings.broker_blocked_connection_timeout
    return BrokerOptions(
        heartbeat=settings.broker_heartbeat,
        connection_attempts=settings.broker_connection_attempts,
        retry_delay=settings.broker_retry_delay,
        socket_timeout=settings.broker_socket_timeout,
        blocked_connection_timeout=blocked if blocked > 0 else None,
        ca_file=settings.broker_ca_file,
        cert_file=settings.broker_cert_file,
        key_file=settings.broker_key_file,
        queues=QueueOptions(
            type=QueueType(settings.broker_queue_type),
            replicas=settings.broker_quorum_replicas,
            delivery_limit=settings.broker_delivery_limit or None,
        ),
    )
