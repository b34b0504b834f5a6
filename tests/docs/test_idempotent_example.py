"""The handlers of docs/howto/idempotent-agents.md keep their promise: the same step, called
again, does its remote work once."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from examples.tutorial.idempotent import make_payments_agent, make_shipping_agent
from sasflow.agents import Agent, Call, PermanentError, TransientError


def _call(key: str, payload: dict[str, Any], attempt: int = 1) -> Call:
    return Call(
        input=payload,
        idempotency_key=key,
        attempt=attempt,
        deadline=time.monotonic() + 5,
        step_id=1,
        run_id=1,
        workflow="order",
        step="step",
        action="action",
        kind="forward",
    )


def _handler(agent: Agent, action: str) -> Any:
    spec = agent.spec(action)
    assert spec is not None
    return spec.function


class Bank:
    """A bank API on localhost that charges once per Idempotency-Key."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.charges: dict[str, int] = {}
        self.status = 200
        bank = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                key = self.headers["Idempotency-Key"]
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                bank.requests.append((key, body))
                if bank.status != 200:
                    self.send_error(bank.status)
                    return
                charge_id = bank.charges.setdefault(key, len(bank.charges) + 1)
                answer = json.dumps({"charge": charge_id, "amount": body["amount"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Quiet: the test reads `requests` instead."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/charges"


@pytest.fixture
def bank() -> Iterator[Bank]:
    bank = Bank()
    # shutdown() waits for serve_forever's next poll (0.5 s by default).
    thread = threading.Thread(
        target=bank.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield bank
    bank.server.shutdown()
    bank.server.server_close()
    thread.join(5)


def test_a_retried_charge_sends_the_same_key_and_is_charged_once(bank: Bank) -> None:
    charge = _handler(make_payments_agent(bank.url), "charge")
    first = charge(_call("key-1", {"amount": 10}, attempt=1))
    again = charge(_call("key-1", {"amount": 10}, attempt=2))
    assert first == again == {"charge": 1, "amount": 10}
    assert [key for key, _ in bank.requests] == ["key-1", "key-1"]
    assert bank.charges == {"key-1": 1}


def test_bank_answers_map_to_transient_and_permanent_failures(bank: Bank) -> None:
    charge = _handler(make_payments_agent(bank.url), "charge")
    bank.status = 503
    with pytest.raises(TransientError, match="bank answered 503"):
        charge(_call("key-2", {"amount": 5}))
    bank.status = 402
    with pytest.raises(PermanentError, match="bank refused the charge: 402"):
        charge(_call("key-2", {"amount": 5}))


def test_an_unreachable_bank_is_transient() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    charge = _handler(make_payments_agent(f"http://127.0.0.1:{port}/charges"), "charge")
    with pytest.raises(TransientError, match="bank unreachable"):
        charge(_call("key-3", {"amount": 5}))


class Carrier:
    def __init__(self) -> None:
        self.shipments: dict[str, dict[str, Any]] = {}

    def find_shipment(self, reference: str) -> dict[str, Any] | None:
        return self.shipments.get(reference)

    def create_shipment(self, reference: str, address: str) -> dict[str, Any]:
        shipment = {"shipment": len(self.shipments) + 1, "address": address}
        self.shipments[reference] = shipment
        return shipment


def test_a_retried_shipment_finds_the_first_one_instead_of_shipping_twice() -> None:
    carrier = Carrier()
    ship = _handler(make_shipping_agent(carrier), "ship")
    first = ship(_call("key-4", {"address": "1 Main St"}, attempt=1))
    again = ship(_call("key-4", {"address": "1 Main St"}, attempt=2))
    other = ship(_call("key-5", {"address": "2 Side St"}))
    assert first == again == {"shipment": 1, "address": "1 Main St"}
    assert other == {"shipment": 2, "address": "2 Side St"}
    assert len(carrier.shipments) == 2
