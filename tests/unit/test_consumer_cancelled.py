"""A consumer the broker cancelled is a lost connection to the role loop: `serve_forever`
warns once naming the queues, tells the hooks of each, and serves (connects) again; the
metrics hooks of every consuming role count it by queue."""

from __future__ import annotations

import logging
import threading

import pytest
from prometheus_client import CollectorRegistry

from sasflow.errors import BrokerUnavailableError, ConsumerCancelledError
from sasflow.hooks import HookChain
from sasflow.observability.metrics import ROLE_METRICS
from sasflow.runtime import Reconnect, serve_forever


def test_serve_forever_reconnects_after_a_cancel_and_reports_each_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    heard: list[str] = []
    served: list[int] = []

    def serve() -> None:
        served.append(1)
        if len(served) == 1:
            raise ConsumerCancelledError(("ns.agent.echo", "ns.breakers.echo.1"))
        stop.set()

    with caplog.at_level(logging.WARNING, logger="sasflow.runtime"):
        serve_forever("agent-echo", serve, stop, Reconnect(initial=0.0), heard.append)

    assert len(served) == 2
    assert heard == ["ns.agent.echo", "ns.breakers.echo.1"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = (
        "agent-echo: the broker cancelled the consumer of 'ns.agent.echo', "
        "'ns.breakers.echo.1' (queue gone or node lost); reconnecting in 0.0s"
    )
    assert warnings == [expected]


def test_a_lost_connection_is_not_reported_as_a_cancel() -> None:
    stop = threading.Event()
    heard: list[str] = []

    def serve() -> None:
        if not stop.is_set():
            stop.set()
            raise BrokerUnavailableError("connection reset")

    serve_forever("submitter", serve, stop, Reconnect(initial=0.0), heard.append)
    assert heard == []


@pytest.mark.parametrize("role", ["scheduler", "submitter", "agent"])
def test_every_consuming_role_counts_cancels_by_queue(role: str) -> None:
    registry = CollectorRegistry()
    hooks = HookChain([ROLE_METRICS[role](registry)])
    hooks.consumer_cancelled("ns.replies")
    hooks.consumer_cancelled("ns.replies")
    hooks.consumer_cancelled("ns.submit")

    counted = {
        queue: registry.get_sample_value("sasflow_consumer_cancellations_total", {"queue": queue})
        for queue in ("ns.replies", "ns.submit")
    }
    assert counted == {"ns.replies": 2.0, "ns.submit": 1.0}
