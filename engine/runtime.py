"""Process plumbing shared by the sasflow roles: signals, reconnect backoff, identities."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from types import FrameType

from sasflow.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ConsumerCancelledError,
    StoreRefusedError,
    StoreUnavailableError,
)

log = logging.getLogger(__name__)


def process_id(role: str) -> str:
    """A name unique to this process incarnation (used as `locked_by` and in logs)."""
    # Bounded: it is stored in columns of 100 characters.
    return f"{role[:30]}:{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`; the role finishes what it holds and returns."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


HEALTHY_SECONDS = 30.0
"""A connection that lasted this long resets the reconnect backoff."""


class Reconnect:
    """Exponential delays between reconnection attempts, reset after a success."""

    def __init__(self, initial: float = 0.2, maximum: float = 5.0) -> None:
        self._initial = initial
        self._maximum = maximum
        self._failures = 0

    def reset(self) -> None:
        self._failures = 0

    def next_delay(self) -> float:
        delay = min(self._maximum, self._initial * 2.0 ** min(self._failures, 16))
        self._failures += 1
        return delay


def serve_forever(
    name: str,
    serve: Callable[[], None],
    stop: threading.Event,
    reconnect: Reconnect | None = None,
    on_cancelled: Callable[[str], None] | None = None,
) -> None:
    """Call `serve` until `stop` is set, reconnecting after the broker or database went away.

    A refusal (wrong credentials, no such database or virtual host) before the process ever
    connected is raised: it is a configuration to fix, and retrying would log it for ever.
    After a first connection it is retried like an outage (credentials being rotated, a
    database being restored), logged as an error. A consumer the broker cancelled is one
    more way to lose the connection: `serve` connects, declares and consumes again, and
    `on_cancelled` hears of each queue (the role's `Hooks.consumer_cancelled`)."""
    reconnect = reconnect or Reconnect()
    while not stop.is_set():
        started = time.monotonic()
        try:
            serve()
        except (BrokerUnavailableError, StoreUnavailableError) as exc:
            refused = isinstance(exc, BrokerRefusedError | StoreRefusedError)
            if isinstance(exc, BrokerRefusedError | StoreRefusedError) and exc.never_connected:
                raise
            if isinstance(exc, ConsumerCancelledError) and on_cancelled is not None:
                for queue in exc.queues:
                    on_cancelled(queue)
            if time.monotonic() - started > HEALTHY_SECONDS:
                reconnect.reset()  # it served well before this outage: start over quickly
            delay = reconnect.next_delay()
            level = logging.ERROR if refused else logging.WARNING
            log.log(level, "%s: %s; reconnecting in %.1fs", name, exc, delay)
            stop.wait(delay)
        else:
            reconnect.reset()
