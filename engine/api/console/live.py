"""Live pages: the runs list and a run's page change as events are recorded, without reload.

One `LiveFeed` per API server reads the events table's newest id (its primary key: one index
probe) every `poll_interval` seconds, and only while a live page is open; when it moves, every
open page re-reads what it shows and, if that changed, its Server-Sent Events stream sends the
new HTML of its regions (`static/live.js` swaps them in). A page is re-read at most once per
`min_interval`, whatever the rate of events. Each stream re-checks its session's token at
every re-read and heartbeat (a revoked token ends it) and ends when the server stops.
Without JavaScript the pages are complete as served (docs/console.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from sasflow.api.console import run_view
from sasflow.api.console.views import (
    PREFIX,
    ConsoleError,
    RunQuery,
    Visitor,
    console_of,
    reader,
    render,
)
from sasflow.api.context import ApiContext, get_context
from sasflow.api.stream.hub import Waker
from sasflow.api.validation import MapItemsShown, RowId
from sasflow.errors import SasflowError
from sasflow.ops import runs as run_ops
from sasflow.ops import tokens
from sasflow.ops.map_items import DEFAULT_SHOWN
from sasflow.states import RunState
from sasflow.store.db import Engine, run_transaction

log = logging.getLogger(__name__)

router = APIRouter(prefix=PREFIX, include_in_schema=False)

RUN_REGIONS = {
    "run-head": "run_head.html",
    "run-steps": "run_steps.html",
    "run-bars": "run_bars.html",
    "run-events": "run_events.html",
}
"""The run page's live regions (element id -> template)."""
RUNS_REGIONS = {"runs-rows": "runs_rows.html"}
"""The runs list's live region: its table's rows."""


@dataclass(frozen=True)
class LiveOptions:
    poll_interval: float = 0.5
    """Seconds between reads of the events table's newest id while a live page is open."""
    min_interval: float = 1.0
    """Least seconds between two re-reads of one open page."""
    heartbeat: float = 15.0
    """Seconds between keep-alive comments (and token checks) on a quiet stream."""


class LiveFeed:
    """The events table's watermark, watched for the open live pages of one API server."""

    def __init__(self, engine: Engine, options: LiveOptions) -> None:
        self._engine = engine
        self.options = options
        self._waker = Waker()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._open = 0
        self._watermark: int | None = None
        self._thread = threading.Thread(target=self._run, name="console-live", daemon=True)

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    @property
    def open_pages(self) -> int:
        with self._lock:
            return self._open

    def start(self) -> None:
        self._thread.start()

    def end(self) -> None:
        """End every open stream, and any opened later (does not block: safe from a signal
        handler)."""
        self._closing.set()
        self._waker.wake()

    def close(self) -> None:
        self.end()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)

    def moved(self) -> None:
        """Make every open page re-read what it shows (the watermark moved)."""
        self._waker.wake()

    def _run(self) -> None:
        while not self._closing.is_set():
            if self.open_pages:
                try:
                    newest = run_transaction(self._engine, run_ops.last_event_id)
                except SasflowError as exc:
                    log.warning("console live pages: %s", exc)
                else:
                    if newest != self._watermark:
                        self._watermark = newest
                        self.moved()
            self._closing.wait(self.options.poll_interval)

    def stream(
        self, still_allowed: Callable[[], bool], read: Callable[[], Mapping[str, str]], seen: str
    ) -> Iterator[str]:
        """Server-Sent Events: `read()` (region id -> HTML) sent whenever it changes, first
        compared with `seen` (the digest of what the page was served with)."""
        with self._lock:
            self._open += 1
        try:
            yield "retry: 2000\n\n"
            last = seen
            next_beat = time.monotonic() + self.options.heartbeat
            dirty = True  # something may have changed between the page and this stream
            while True:
                generation = self._waker.generation
                if self._closing.is_set():
                    return
                beat = time.monotonic() >= next_beat
                if (dirty or beat) and not still_allowed():
                    yield "event: end\ndata: signed out\n\n"
                    return
                if dirty:
                    try:
                        parts = read()
                    except (ConsoleError, SasflowError) as exc:  # the run deleted, the store lost
                        log.info("console live page ends: %s", exc)
                        yield "event: end\ndata: reload the page\n\n"
                        return
                    found = digest(parts)
                    if found != last:
                        yield _message(json.dumps(parts))
                        last = found
                        next_beat = time.monotonic() + self.options.heartbeat
                        beat = False
                if beat:  # nothing written for a heartbeat: proxies and dead peers need bytes
                    yield ": keep-alive\n\n"
                    next_beat = time.monotonic() + self.options.heartbeat
                self._closing.wait(self.options.min_interval if dirty else 0)
                dirty = False
                self._waker.wait(generation, next_beat - time.monotonic())
                dirty = self._waker.generation != generation
        finally:
            with self._lock:
                self._open -= 1


def digest(parts: Mapping[str, str]) -> str:
    """What identifies the regions' HTML (the page carries it, so an unchanged page is not
    sent again when its stream opens)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _message(data: str) -> str:
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{lines}\n"


def feed_of(request: Request) -> LiveFeed:
    found: LiveFeed = request.app.state.console_live
    return found


def regions(
    request: Request, who: Visitor, templates: Mapping[str, str], values: Mapping[str, Any]
) -> dict[str, str]:
    """Each region's HTML, rendered as the page renders it."""
    env = console_of(request).templates.env
    context = {"who": who, "csrf": who.session.csrf, "run_states": list(RunState), **values}
    return {key: env.get_template(name).render(context) for key, name in templates.items()}


Context = Annotated[ApiContext, Depends(get_context)]
Reader = Annotated[Visitor, Depends(reader)]


def _still_allowed(ctx: ApiContext, who: Visitor) -> Callable[[], bool]:
    token_hash = who.session.token_hash

    def check() -> bool:
        if token_hash is None:
            return False
        found = ctx.transaction(lambda conn: tokens.authenticate_hash(conn, token_hash))
        return found is not None and tokens.grants(found["scopes"], "read")

    return check


def _events_response(stream: Iterator[str]) -> StreamingResponse:
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.get("/runs/live")
def runs_live(
    *,
    request: Request,
    who: Reader,
    ctx: Context,
    state: Annotated[list[str] | None, Query()] = None,
    workflow: str = "",
    key: str = "",
    text: str = "",
    since: str = "",
    until: str = "",
    seen: str = "",
) -> StreamingResponse:
    """The runs list's first page, as it changes (Server-Sent Events)."""
    query = RunQuery(tuple(state or ()), workflow, key, text, since, until)
    query.to_filter(1)  # a malformed filter is refused now, not in the stream

    def read() -> dict[str, str]:
        return regions(request, who, RUNS_REGIONS, run_view.runs_values(ctx, query, None))

    feed = feed_of(request)
    return _events_response(feed.stream(_still_allowed(ctx, who), read, seen))


@router.get("/runs/{run_id}/live")
def run_live(
    *,
    request: Request,
    who: Reader,
    ctx: Context,
    run_id: RowId,
    seen: str = "",
    shown: str = "",
    map_items: MapItemsShown = DEFAULT_SHOWN,
) -> StreamingResponse:
    """A run's page regions (state, steps, picture, bars, events) as they change (SSE);
    `shown`: the run's state the page's actions were made for (a note asks to reload for the
    actions of another)."""
    run_view.run_values(ctx, run_id, map_items=0)  # an unknown run is a 404 now, not in the stream

    def read() -> dict[str, str]:
        values = {**run_view.run_values(ctx, run_id, map_items=map_items), "shown": shown}
        return regions(request, who, RUN_REGIONS, values)

    feed = feed_of(request)
    return _events_response(feed.stream(_still_allowed(ctx, who), read, seen))


def run_page(
    request: Request,
    who: Visitor,
    ctx: ApiContext,
    run_id: int,
    *,
    typed: run_view.Typed | None = None,
    status: int = 200,
    map_items: int = DEFAULT_SHOWN,
) -> HTMLResponse:
    """The run page with its live regions (and, after a refused form, what was typed)."""
    values = run_view.run_values(ctx, run_id, typed, map_items=map_items)
    values["shown"] = values["run"]["state"]
    parts = regions(request, who, RUN_REGIONS, values)
    return render(
        request, who, "run.html", {**values, "parts": parts, "seen": digest(parts)}, status=status
    )


def runs_page(
    request: Request,
    who: Visitor,
    ctx: ApiContext,
    query: RunQuery,
    cursor: int | None,
    *,
    ticked: frozenset[int] = frozenset(),
    compensate: bool = False,
    bulk_error: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    """The runs list; its first page is live (a later page stays as served). A refused bulk
    form's list keeps its `ticked` runs, its `compensate` box and says `bulk_error`."""
    values = {**run_view.runs_values(ctx, query, cursor), "ticked": ticked}
    parts = regions(request, who, RUNS_REGIONS, values)
    live_url = None
    if cursor is None:
        live_url = f"{PREFIX}/runs/live?" + urlencode([*query.params(), ("seen", digest(parts))])
    extra = {
        "parts": parts,
        "live_url": live_url,
        "bulk_error": bulk_error,
        "compensate": compensate,
    }
    return render(request, who, "runs.html", {**values, **extra}, status=status)
