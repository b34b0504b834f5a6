"""Every exception pika can raise while connecting, publishing or consuming is translated at the
transport boundary: broker unavailability becomes BrokerUnavailableError (the role reconnects
with backoff), a refused message PublishError; only pika's checks of how it is called (bugs of
ours) pass through.

The classes are enumerated from pika itself, so a class a new pika version adds is tested (and,
if it derives from none of the known bases, fails here until it is classified)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import threading
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.utils import connection_workflow

from sasflow.errors import BrokerRefusedError, BrokerUnavailableError, PublishError
from sasflow.runtime import Reconnect, serve_forever
from sasflow.transport import rabbitmq
from sasflow.transport.rabbitmq import RabbitMQTransport

# Decided here, independently of the production tables: these are not broker unavailability.
REFUSALS_OF_ONE_MESSAGE = {
    "UnroutableError",
    "NackError",
    "ShortStringTooLong",
    "BodyTooLongError",
    "UnsupportedAMQPFieldException",
}
# The broker refused this process's credentials or virtual host: a configuration error at start.
REFUSALS_OF_THE_CONFIGURATION = {
    "ProbableAuthenticationError",
    "ProbableAccessDeniedError",
    "AuthenticationError",
}
BUGS_OF_THE_CALLER = {
    "DuplicateConsumerTag",
    "ChannelError",
    "DuplicateGetOkCallback",
    "ReentrancyError",
    "InvalidChannelNumber",
}


def _pika_exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in pika's modules that import here (the adapters for
    twisted, tornado, gevent and asyncio-less loops need packages sasflow does not use)."""
    modules: list[Any] = [pika.exceptions, connection_workflow]
    for info in pkgutil.walk_packages(pika.__path__, "pika."):
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError:
            continue
    found: dict[str, type[BaseException]] = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("pika"):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


CLASSES = _pika_exception_classes()


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance made with plausible arguments for whatever its constructor requires."""
    samples: dict[str, Any] = {
        "reply_code": 320,
        "reply_text": "CONNECTION_FORCED - broker forced connection closure",
        "exceptions": [OSError("connection refused")],
        "exception": OSError("connection refused"),
    }
    args = []
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if param.kind == param.VAR_POSITIONAL:
            args += [1, 2]  # several pika reprs format args[0] and args[1]
        elif name != "self" and param.kind != param.VAR_KEYWORD and param.default is param.empty:
            args.append(samples.get(name, "x"))
    return cls(*args)


def test_pika_classes_are_found_including_the_connection_workflow_ones() -> None:
    names = {cls.__name__ for cls in CLASSES}
    expected = {
        "AMQPConnectorStackTimeout",
        "AMQPConnectionWorkflowFailed",
        "AMQPConnectorException",
        "StreamLostError",
        "AMQPHeartbeatTimeout",
        *REFUSALS_OF_ONE_MESSAGE,
        *BUGS_OF_THE_CALLER,
    }
    assert expected - names == set()


def _through_translation(raised: BaseException) -> BaseException:
    def fail() -> None:
        raise raised

    try:
        with rabbitmq._translated():
            fail()
    except BaseException as exc:  # noqa: BLE001 - which one comes out is the point
        return exc
    raise AssertionError("nothing was raised")  # pragma: no cover


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_each_pika_exception_is_translated_as_decided(cls: type[BaseException]) -> None:
    raised = _instance(cls)
    caught = _through_translation(raised)
    if cls.__name__ in BUGS_OF_THE_CALLER:
        expected: type[BaseException] = cls
    elif cls.__name__ in REFUSALS_OF_ONE_MESSAGE:
        expected = PublishError
    elif cls.__name__ in REFUSALS_OF_THE_CONFIGURATION:
        expected = BrokerRefusedError
    else:
        expected = BrokerUnavailableError
    assert (type(caught).__name__, caught.__cause__ or caught) == (
        expected.__name__,
        raised,
    )


@pytest.mark.parametrize(
    "error",
    [
        connection_workflow.AMQPConnectorStackTimeout("Timeout during AMQP handshake"),
        connection_workflow.AMQPConnectionWorkflowAborted(),
        pika.exceptions.AMQPConnectionError("connection refused"),
        pika.exceptions.IncompatibleProtocolError("stream terminated"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("timed out"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_failed_connect_is_broker_unavailable(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    def fail(_params: object) -> None:
        raise error

    monkeypatch.setattr(pika, "BlockingConnection", fail)
    transport = RabbitMQTransport("amqp://localhost:1/%2F", process_name="test")
    with pytest.raises(BrokerUnavailableError) as caught:
        transport.connect()
    assert caught.value.__cause__ is error


def test_a_role_loop_keeps_reconnecting_through_handshake_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What killed every role: the handshake timeout escaped serve_forever."""
    attempts: list[int] = []
    stop = threading.Event()

    def fail(_params: object) -> None:
        attempts.append(1)
        if len(attempts) == 3:
            stop.set()
        raise connection_workflow.AMQPConnectorStackTimeout("Timeout during AMQP handshake")

    monkeypatch.setattr(pika, "BlockingConnection", fail)
    transport = RabbitMQTransport("amqp://localhost:1/%2F", process_name="test")
    serve_forever("test", transport.connect, stop, Reconnect(initial=0.01, maximum=0.01))
    assert len(attempts) == 3
