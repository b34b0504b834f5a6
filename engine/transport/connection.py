"""How a process connects to RabbitMQ: its options (from Settings at the CLI) and pika's
connection parameters for each URL of a broker list, TLS included."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

import pika

from sasflow.errors import ConfigurationError
from sasflow.redact import redact_url
from sasflow.transport.brokers import broker_urls
from sasflow.transport.queues import QueueOptions


@dataclass(frozen=True)
class BrokerOptions:
    """How a process connects to RabbitMQ (from Settings at the CLI; defaults here)."""

    heartbeat: int = 30
    """Seconds between AMQP heartbeats (a dead peer is noticed after about two); 0: none."""
    connection_attempts: int = 1
    """Attempts per connect; sasflow's own reconnect loop backs off between connects."""
    retry_delay: float = 2.0
    """Seconds between those attempts."""
    socket_timeout: float = 10.0
    blocked_connection_timeout: float | None = 60.0
    """Seconds the broker may block publishers (memory or disk alarm) before the connection
    is dropped and reconnected; None: wait for ever."""
    ca_file: str | None = None
    """CA bundle that verifies the broker's certificate (amqps:// only; default: the
    system's)."""
    cert_file: str | None = None
    """Client certificate (PEM) for brokers that require one (amqps:// only)."""
    key_file: str | None = None
    """Private key of `cert_file` (default: in `cert_file`)."""
    queues: QueueOptions = field(default_factory=QueueOptions)
    """The type and arguments of the durable work queues (sasflow.transport.queues)."""


def connection_parameters(url: str, options: BrokerOptions) -> pika.URLParameters:
    """pika's parameters for `url` with `options` applied; ConfigurationError if invalid."""
    try:
        params = pika.URLParameters(url)
    except Exception as exc:  # pika raises assorted types for a bad URL
        raise ConfigurationError(f"invalid broker URL {redact_url(url)!r}: {exc}") from exc
    params.heartbeat = options.heartbeat
    params.blocked_connection_timeout = options.blocked_connection_timeout
    params.connection_attempts = options.connection_attempts
    params.retry_delay = options.retry_delay
    params.socket_timeout = options.socket_timeout
    tls_files = options.ca_file or options.cert_file or options.key_file
    if tls_files and params.ssl_options is None:
        raise ConfigurationError(
            f"a broker CA, certificate or key file is set but {redact_url(url)!r} is not "
            "amqps://: the files would be ignored"
        )
    if tls_files:
        params.ssl_options = pika.SSLOptions(_tls_context(options))
    return params


def broker_parameters(urls: str, options: BrokerOptions) -> tuple[pika.URLParameters, ...]:
    """pika's parameters for each URL of the broker list `urls`, `options` (timeouts, TLS
    files) applied to every one; ConfigurationError names the first bad entry."""
    entries = broker_urls(urls)
    made: list[pika.URLParameters] = []
    for index, url in enumerate(entries, start=1):
        try:
            made.append(connection_parameters(url, options))
        except ConfigurationError as exc:
            if len(entries) == 1:
                raise
            raise ConfigurationError(f"broker URL {index} of {len(entries)}: {exc}") from exc
    return tuple(made)


def _tls_context(options: BrokerOptions) -> ssl.SSLContext:
    """A verifying client context (hostname checked against the URL's host by pika)."""
    try:
        context = ssl.create_default_context(cafile=options.ca_file)
        if options.cert_file:
            context.load_cert_chain(options.cert_file, options.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"broker TLS files cannot be used: {exc}") from exc
    if options.key_file and not options.cert_file:
        raise ConfigurationError("a broker key file needs its certificate file")
    return context
