"""Choose the Transport implementation from the broker URL's scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from sasflow.errors import ConfigurationError
from sasflow.redact import redact_url
from sasflow.transport.base import Transport
from sasflow.transport.memory import MemoryBroker, MemoryTransport
from sasflow.transport.rabbitmq import BrokerOptions, RabbitMQTransport

AMQP_SCHEMES = ("amqp", "amqps")
MEMORY_SCHEME = "memory"
ACCEPTED = "amqp://, amqps:// (RabbitMQ) or memory:// (the in-process bus)"


def _scheme(url: str) -> str:
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return ""


def is_in_process(url: str) -> bool:
    """True for `memory://`: the transport only connects roles inside one process."""
    return _scheme(url) == MEMORY_SCHEME


def make_transport(
    url: str,
    *,
    process_name: str,
    broker: MemoryBroker | None = None,
    options: BrokerOptions | None = None,
) -> Transport:
    """A new, unconnected transport for `url`; `memory://` needs the process's MemoryBroker.
    `options` (heartbeat, timeouts, TLS files) apply to RabbitMQ only."""
    scheme = _scheme(url)
    if scheme in AMQP_SCHEMES:
        return RabbitMQTransport(url, process_name=process_name, options=options)
    if scheme == MEMORY_SCHEME:
        if broker is None:
            raise ConfigurationError(
                f"broker URL {url!r} names the in-process bus, but no MemoryBroker was given: "
                "the roles sharing it must run in one process and be handed the same broker"
            )
        return MemoryTransport(broker, process_name=process_name)
    raise ConfigurationError(
        f"unsupported broker URL {redact_url(url)!r}: the scheme must be {ACCEPTED}"
    )
