"""The parts that make handlers easy to write right, without a broker: the traceback a failed
step keeps (from the handler's frame, bounded, redacted), `Defer`, `async def` handlers on the
agent's event loop (cancelled at the deadline), and the refusal of generator handlers."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from sasflow.agents import Agent, Call, Defer
from sasflow.agents.aio import AbortedError, DeadlinePassedError, HandlerLoop
from sasflow.agents.tracebacks import MAX_FRAMES, handler_traceback, relative_file
from sasflow.errors import DefinitionError
from sasflow.messages import MAX_TRACEBACK_CHARS, ErrorInfo, Reply, parse
from sasflow.redact import redact_text


def _call(seconds: float = 5.0) -> Call:
    return Call(
        input={},
        idempotency_key="k",
        attempt=1,
        deadline=time.monotonic() + seconds,
        step_id=1,
        run_id=1,
        workflow="wf",
        step="s",
        action="a",
        kind="forward",
    )


def _machinery(function: Any, call: Call) -> Any:
    """Stands for the agent's frames above the handler."""
    return function(call)


def _helper(depth: int) -> None:
    if depth == 0:
        raise ValueError("postgresql://shop:s3cret@db.internal/shop refused the order")
    _helper(depth - 1)


def _failing(call: Call) -> None:
    _helper(3)


def _caught(function: Any) -> BaseException:
    try:
        _machinery(function, _call())
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("nothing raised")


def test_the_traceback_starts_at_the_handler_and_ends_with_the_exception() -> None:
    text = handler_traceback(_caught(_failing), _failing)
    assert text.startswith("Traceback (most recent call last):\n")
    assert "_machinery" not in text
    assert "in _failing" in text
    assert text.count("in _helper") == 4
    assert text.endswith("refused the order\n")


def test_the_traceback_hides_url_passwords() -> None:
    text = handler_traceback(_caught(_failing), _failing)
    assert "s3cret" not in text
    assert "postgresql://shop:***@db.internal/shop" in text
    assert redact_text("see amqp://guest:guest@host:5672/ and http://x/") == (
        "see amqp://guest:***@host:5672/ and http://x/"
    )


def test_a_deep_traceback_keeps_its_last_frames_and_characters() -> None:
    def deep(call: Call) -> None:
        _helper(500)

    text = handler_traceback(_caught(deep), deep)
    assert len(text) <= MAX_TRACEBACK_CHARS
    assert text.count("in _helper") <= MAX_FRAMES
    assert text.endswith("refused the order\n")


def test_a_chained_exception_keeps_its_cause() -> None:
    def wrapping(call: Call) -> None:
        try:
            _helper(0)
        except ValueError as exc:
            raise RuntimeError("order failed") from exc

    text = handler_traceback(_caught(wrapping), wrapping)
    assert "direct cause" in text
    assert text.endswith("RuntimeError: order failed\n")


def test_a_reply_without_traceback_still_parses_and_a_long_one_is_cut_when_stored() -> None:
    old = b'{"step_id":1,"attempt":1,"status":"error","error":{"type":"E","message":"m"}}'
    assert parse(Reply, old).outcome().error is not None
    assert parse(Reply, old).outcome().error.to_json() == {"type": "E", "message": "m"}  # type: ignore[union-attr]
    long = ErrorInfo(type="E", message="m", traceback="x" * 10_000 + "the end")
    stored = long.stored().to_json()
    assert len(stored["traceback"]) == MAX_TRACEBACK_CHARS
    assert stored["traceback"].endswith("the end")


def test_defer_needs_a_finite_non_negative_delay() -> None:
    assert (Defer(30, "waiting for the bank").seconds, str(Defer(2))) == (
        30.0,
        "deferred by the handler",
    )
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number >= 0"):
            Defer(bad)


def test_generator_handlers_are_refused_when_defined() -> None:
    agent = Agent("svc")

    async def stream(call: Call) -> Any:
        yield 1

    def chunks(call: Call) -> Any:
        yield 1

    for function in (stream, chunks):
        with pytest.raises(DefinitionError, match="generator function"):
            agent.add_handler(function.__name__, function)


def test_async_def_handlers_are_accepted() -> None:
    agent = Agent("svc")

    @agent.handler("fetch")
    async def fetch(call: Call) -> dict[str, Any]:
        return {}

    assert agent.actions == {"fetch"}


@pytest.fixture
def loop() -> Any:
    handlers = HandlerLoop("test")
    yield handlers
    handlers.close()


def test_a_coroutine_runs_on_one_loop_thread_and_returns(loop: HandlerLoop) -> None:
    threads: list[str] = []

    async def work(n: int) -> int:
        await asyncio.sleep(0)
        threads.append(threading.current_thread().name)
        return n * 2

    assert [loop.run(work(n), _call()) for n in (1, 2)] == [2, 4]
    assert threads == ["test-loop", "test-loop"]


def test_a_coroutine_raises_into_the_worker_thread(loop: HandlerLoop) -> None:
    async def fail() -> None:
        raise ConnectionRefusedError("down")

    with pytest.raises(ConnectionRefusedError, match="down"):
        loop.run(fail(), _call())


def test_the_deadline_cancels_the_coroutine(loop: HandlerLoop) -> None:
    cancelled = threading.Event()

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(DeadlinePassedError):
        loop.run(hang(), _call(0.2))
    assert cancelled.is_set()


def test_an_aborted_call_cancels_the_coroutine(loop: HandlerLoop) -> None:
    cancelled = threading.Event()
    call = _call(30)

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    threading.Timer(0.1, call.aborted.set).start()
    with pytest.raises(AbortedError):
        loop.run(hang(), call)
    assert cancelled.wait(5)


def test_closing_the_loop_ends_its_thread() -> None:
    handlers = HandlerLoop("closing")

    async def nothing() -> None:
        return None

    handlers.run(nothing(), _call())
    assert "closing-loop" in {t.name for t in threading.enumerate()}
    handlers.close()
    assert "closing-loop" not in {t.name for t in threading.enumerate()}


def test_closing_the_loop_under_a_running_coroutine_releases_its_worker() -> None:
    """The agent stops: the worker waiting for a coroutine is not left waiting forever."""
    handlers = HandlerLoop("stopping")
    started = threading.Event()
    outcome: list[BaseException] = []

    async def hang() -> None:
        started.set()
        await asyncio.Event().wait()

    def worker() -> None:
        try:
            handlers.run(hang(), _call(30))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(5)
    handlers.close()
    thread.join(5)
    assert not thread.is_alive()
    assert [type(e) for e in outcome] == [AbortedError]


def test_a_tracebacks_files_are_named_from_their_import_root_not_the_machines_path() -> None:
    def wrapping(call: Call) -> None:
        try:
            _helper(0)
        except ValueError as exc:
            raise RuntimeError("order failed") from exc

    text = handler_traceback(_caught(wrapping), wrapping)
    here = __file__
    assert here not in text
    assert 'File "tests/unit/test_handler_parts.py"' in text
    assert text.count("tests/unit/test_handler_parts.py") >= 2  # the cause's frames too
    roots = ["/srv/app/", "/srv/"]
    assert relative_file("/srv/app/shop/handlers.py", roots) == "shop/handlers.py"
    assert relative_file("/elsewhere/x.py", roots) == "/elsewhere/x.py"
