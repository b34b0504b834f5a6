"""The console's live streams without a server (console/live.py): what a stream sends as its
page changes or not, the keep-alives, a revoked session, the server's stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from sqlalchemy import Engine

from sasflow.api.console.live import LiveFeed, LiveOptions, digest

RETRY = "retry: 2000\n\n"
KEEP_ALIVE = ": keep-alive\n\n"


def _feed() -> LiveFeed:
    """A feed whose watermark thread is not started: the tests move it by hand."""
    return LiveFeed(cast(Engine, None), LiveOptions(min_interval=0.0, heartbeat=0.05))


def test_an_unchanged_page_gets_keep_alives_and_a_change_once() -> None:
    feed = _feed()
    html = {"run-head": "<h1>Run 1 running</h1>"}
    stream = feed.stream(lambda: True, lambda: dict(html), digest(html))
    assert next(stream) == RETRY
    assert next(stream) == KEEP_ALIVE  # its first read is what the page was served with
    assert feed.open_pages == 1
    html["run-head"] = "<h1>Run 1 completed</h1>"
    feed.moved()
    assert next(stream) == 'data: {"run-head": "<h1>Run 1 completed</h1>"}\n\n'
    feed.moved()  # moved again, nothing new to show: a keep-alive, not the same HTML twice
    assert next(stream) == KEEP_ALIVE
    feed.end()
    assert list(stream) == []
    assert feed.open_pages == 0


def test_keep_alives_flow_while_events_arrive_that_change_nothing() -> None:
    """A busy system whose events never change this page: bytes still flow every heartbeat
    (a proxy's idle timeout, a peer gone away)."""
    feed = _feed()
    html = {"runs-rows": "<tr><td>No run matches.</td></tr>"}
    stream = feed.stream(lambda: True, lambda: html, digest(html))
    assert next(stream) == RETRY
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            feed.moved()
            stop.wait(0.005)

    mover = threading.Thread(target=busy)
    mover.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(next, stream).result(timeout=5) == KEEP_ALIVE
    finally:
        stop.set()
        mover.join()
        feed.end()


def test_a_stream_whose_token_was_revoked_ends() -> None:
    feed = _feed()
    allowed = [True]
    html = {"run-head": "a"}
    stream: Iterator[str] = feed.stream(lambda: allowed[0], lambda: html, digest(html))
    assert next(stream) == RETRY
    assert next(stream) == KEEP_ALIVE
    allowed[0] = False
    assert next(stream) == "event: end\ndata: signed out\n\n"
    assert list(stream) == []
    assert feed.open_pages == 0


def test_a_stream_opened_after_the_server_began_stopping_ends_at_once() -> None:
    feed = _feed()
    feed.end()
    assert list(feed.stream(lambda: True, dict, "")) == [RETRY]
