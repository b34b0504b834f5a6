"""Handlers written the obvious way work, through a scheduler and an agent on the real broker
and database: an httpx call to a service that refuses then accepts completes the run; a 503's
`Retry-After` is waited for, and a 429's that does not fit in the deadline defers the step
without counting a failure; an `async def` handler completes its run, and one past its
deadline is cancelled; a handler that raises `Defer` once completes with no failure counted;
a handler's traceback is shown by `sasflow runs show --traceback`."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, select

from sasflow import Registry, RetryPolicy, Step, StepPolicy, Workflow
from sasflow.agents import Agent, Call, Defer, PermanentError
from sasflow.cli.main import cli
from sasflow.store.schema import events
from sasflow.transport.topology import Names
from tests import harness

pytestmark = pytest.mark.integration

FAST = RetryPolicy(initial=0.05, maximum=0.2)


@dataclass
class Service:
    """A local HTTP service answering GET with the next canned (status, headers), then 200."""

    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    seen: list[float] = field(default_factory=list)
    """When each request arrived (monotonic)."""


def _serve(service: Service, port: int = 0) -> ThreadingHTTPServer:
    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            service.seen.append(time.monotonic())
            status, headers = service.answers.pop(0) if service.answers else (200, {})
            body = b'{"paid": true}' if status == 200 else b"{}"
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Answer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.fixture
def servers() -> Iterator[list[ThreadingHTTPServer]]:
    started: list[ThreadingHTTPServer] = []
    yield started
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def _http_agent(port: int, tries: list[str]) -> Agent:
    """An agent whose handler is what a user writes first: httpx, raise_for_status."""
    bank = Agent("bank", retry=FAST)

    @bank.handler("charge")
    def charge(call: Call) -> Any:
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}/charge", timeout=call.remaining())
        except httpx.HTTPError as exc:
            tries.append(type(exc).__name__)
            raise
        tries.append(str(answer.status_code))
        answer.raise_for_status()
        return answer.json()

    return bank


def _one_step(agent: Agent, action: str, timeout: float, max_failures: int = 3) -> Registry:
    policy = StepPolicy(timeout=timeout, max_failures=max_failures)
    return Registry([Workflow("solo", [Step("only", agent.name, action, policy=policy)])], [agent])


def _run_to_end(
    engine: Engine, database_url: str, names: Names, registry: Registry, agent: Agent
) -> int:
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(agent, names)
    ):
        run_id = harness.submit(engine, registry, names, "solo", key="k", run_input={})
        harness.wait_for(
            lambda: harness.run_states(engine)[run_id] in {"completed", "error"}, what="run ends"
        )
    return run_id


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _step_reasons(engine: Engine) -> list[str | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(events.c.reason).where(events.c.entity == "step").order_by(events.c.id)
        )
        return [r.reason for r in rows]


def test_an_httpx_call_refused_then_accepted_completes_the_run(
    engine: Engine, database_url: str, names: Names, servers: list[ThreadingHTTPServer]
) -> None:
    """`httpx.ConnectError` is no `ConnectionError`, yet it is retried within the deadline."""
    port = _free_port()
    tries: list[str] = []
    bank = _http_agent(port, tries)
    registry = _one_step(bank, "charge", timeout=20, max_failures=1)
    with harness.running(
        harness.scheduler(engine, database_url, registry, names), harness.agent(bank, names)
    ):
        run_id = harness.submit(engine, registry, names, "solo", key="k", run_input={})
        harness.wait_for(lambda: "ConnectError" in tries, what="a refused connection")
        servers.append(_serve(Service(), port))
        harness.wait_for(
            lambda: harness.run_states(engine)[run_id] in {"completed", "error"}, what="run ends"
        )
    assert harness.run_states(engine)[run_id] == "completed"
    assert tries[-1] == "200"
    (step,) = harness.step_rows(engine)
    assert (step.attempt, step.failure_count, step.output) == (1, 0, {"paid": True})


def test_a_503_retry_after_is_waited_for_within_the_deadline(
    engine: Engine, database_url: str, names: Names, servers: list[ThreadingHTTPServer]
) -> None:
    """The next try comes no sooner than the service asked (the backoff alone is <= 0.2 s)."""
    service = Service(answers=[(503, {"Retry-After": "1"})])
    servers.append(httpd := _serve(service))
    tries: list[str] = []
    bank = _http_agent(httpd.server_address[1], tries)
    run_id = _run_to_end(engine, database_url, names, _one_step(bank, "charge", 10), bank)
    assert harness.run_states(engine)[run_id] == "completed"
    assert tries == ["503", "200"]
    assert service.seen[1] - service.seen[0] >= 1.0
    (step,) = harness.step_rows(engine)
    assert (step.attempt, step.failure_count) == (1, 0)


def test_a_429_retry_after_past_the_deadline_defers_the_step_without_a_failure(
    engine: Engine, database_url: str, names: Names, servers: list[ThreadingHTTPServer]
) -> None:
    """Retry-After 3 s with a 2 s timeout: the step is deferred 3 s, not failed, and its next
    attempt completes it."""
    service = Service(answers=[(429, {"Retry-After": "3"})])
    servers.append(httpd := _serve(service))
    tries: list[str] = []
    bank = _http_agent(httpd.server_address[1], tries)
    registry = _one_step(bank, "charge", timeout=2, max_failures=1)
    run_id = _run_to_end(engine, database_url, names, registry, bank)
    assert harness.run_states(engine)[run_id] == "completed"
    assert tries == ["429", "200"]
    assert service.seen[1] - service.seen[0] >= 3.0
    (step,) = harness.step_rows(engine)
    assert (step.attempt, step.failure_count) == (2, 0)
    assert "deferred" in _step_reasons(engine)


def test_an_async_handler_completes_its_run(
    engine: Engine, database_url: str, names: Names
) -> None:
    quotes = Agent("quotes")

    @quotes.handler("price")
    async def price(call: Call) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"price": 42, "key": call.idempotency_key}

    run_id = _run_to_end(engine, database_url, names, _one_step(quotes, "price", 10), quotes)
    assert harness.run_states(engine)[run_id] == "completed"
    (step,) = harness.step_rows(engine)
    assert step.output == {"price": 42, "key": step.idempotency_key}


def test_an_async_handler_past_its_deadline_is_cancelled_and_stays_silent(
    engine: Engine, database_url: str, names: Names
) -> None:
    """The deadline stops an `async def` handler: its task is cancelled, no reply is sent (the
    supervisor's sweep will count the failure, as for any handler past its deadline)."""
    quotes = Agent("quotes")
    cancelled: list[int] = []

    @quotes.handler("price")
    async def price(call: Call) -> dict[str, Any]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(call.attempt)
            raise
        return {"price": 42}

    registry = _one_step(quotes, "price", timeout=1)
    worker = harness.agent(quotes, names)
    with harness.running(harness.scheduler(engine, database_url, registry, names), worker):
        harness.submit(engine, registry, names, "solo", key="k", run_input={})
        harness.wait_for(lambda: cancelled == [1], what="the attempt's task cancelled")
        harness.wait_for(lambda: worker.stats.abandoned == 1, what="the attempt abandoned")
    assert (worker.stats.replied_ok, worker.stats.replied_failed, worker.stats.deferred) == (
        0,
        0,
        0,
    )
    (step,) = harness.step_rows(engine)
    assert (step.state, step.attempt, step.failure_count) == ("processing", 1, 0)


def test_a_handler_that_defers_once_completes_with_no_failure_counted(
    engine: Engine, database_url: str, names: Names
) -> None:
    bank = Agent("bank")
    calls: list[float] = []

    @bank.handler("settle")
    def settle(call: Call) -> dict[str, Any]:
        calls.append(time.monotonic())
        if call.attempt == 1:
            raise Defer(0.5, reason="waiting for the bank's batch")
        return {"settled": True}

    registry = _one_step(bank, "settle", timeout=10, max_failures=1)
    run_id = _run_to_end(engine, database_url, names, registry, bank)
    assert harness.run_states(engine)[run_id] == "completed"
    (step,) = harness.step_rows(engine)
    assert (step.attempt, step.failure_count, step.output) == (2, 0, {"settled": True})
    assert calls[1] - calls[0] >= 0.5
    assert _step_reasons(engine).count("deferred") == 1


def test_runs_show_prints_the_handlers_traceback(
    engine: Engine, database_url: str, names: Names
) -> None:
    shop = Agent("shop")

    def _reserve(sku: str) -> None:
        raise PermanentError(f"no stock of {sku}")

    @shop.handler("reserve")
    def reserve(call: Call) -> None:
        _reserve("sku-9")

    run_id = _run_to_end(engine, database_url, names, _one_step(shop, "reserve", 10), shop)
    env = {"SASFLOW_DATABASE_URL": database_url, "SASFLOW_NAMESPACE": names.namespace}
    plain = CliRunner().invoke(cli, ["runs", "show", str(run_id)], env=env)
    shown = CliRunner().invoke(cli, ["runs", "show", str(run_id), "--traceback"], env=env)
    assert (plain.exit_code, shown.exit_code) == (0, 0), shown.output
    assert "Traceback" not in plain.output
    assert "PermanentError: no stock of sku-9" in plain.output
    traceback = shown.output[shown.output.index("Traceback (most recent call last):") :]
    assert 'in reserve\n          _reserve("sku-9")' in traceback
    assert "in _reserve" in traceback
    assert "sasflow.agents.errors.PermanentError: no stock of sku-9" in traceback
