"""The console's parts that need no server: the DAG layout, the runs filter as it travels in
forms, the signed session cookie, the one-time message after an action, the charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from sasflow.api.console import charts, dag, flash, run_view
from sasflow.api.console.session import COOKIE, Session, SessionCodec
from sasflow.api.console.views import ConsoleError, RunQuery, local
from sasflow.ops import map_items
from sasflow.settings import Settings
from sasflow.store.operator.charts import Bucket, Series


def test_the_dag_places_each_step_after_its_longest_chain() -> None:
    """A diamond: start | left, right | end; one edge per dependency, left to right."""
    order = ("start", "left", "right", "end")
    deps = {"left": ("start",), "right": ("start",), "end": ("left", "right")}
    picture = dag.layout(order, deps, {"start": "processed", "left": "error"})
    where = {n.name: (n.x, n.y, n.state) for n in picture.nodes}
    m, col, row = dag.MARGIN, dag.COLUMN_W, dag.ROW_H
    assert where == {
        "start": (m, m, "processed"),
        "left": (m + col, m, "error"),
        "right": (m + col, m + row, "?"),
        "end": (m + 2 * col, m, "?"),
    }
    assert len(picture.edges) == 4
    assert all(e.x1 < e.x2 for e in picture.edges)
    assert picture.width == 2 * m + 2 * col + dag.BOX_W
    assert picture.height == 2 * m + row + dag.BOX_H


def test_a_decorated_box_is_taller_and_the_boxes_below_it_move_down() -> None:
    """A map's box carries its items' counts (run_view.decorations): two more lines."""
    order = ("load", "reserve", "audit", "ship")
    deps = {"reserve": ("load",), "audit": ("load",), "ship": ("reserve", "audit")}
    lines = run_view.map_lines({"processing": 5, "processed": 20})
    assert lines == ("25 items", "20 processed, 5 processing")
    decorated = dag.Decoration(lines, href="/ui/runs/1#map-reserve")
    picture = dag.layout(order, deps, {}, {"reserve": decorated})
    nodes = {n.name: n for n in picture.nodes}
    m, row, line = dag.MARGIN, dag.ROW_H, dag.LINE_H
    assert nodes["reserve"].height == dag.BOX_H + 2 * line
    assert nodes["reserve"].decoration.href == "/ui/runs/1#map-reserve"
    assert (nodes["audit"].y, nodes["audit"].height) == (m + row + 2 * line, dag.BOX_H)
    assert picture.height == nodes["audit"].y + dag.BOX_H + m


def test_map_items_are_grouped_under_their_map_with_its_counts() -> None:
    load = {"id": 1, "name": "load", "kind": "forward", "input": {}, "map_parent": None}
    spec = {"map": {"size": 3, "parallelism": 2, "on_item_failure": "continue"}}
    reserve = {"id": 2, "name": "reserve", "kind": "forward", "input": spec, "map_parent": None}
    items = [
        {"id": 3 + i, "name": f"reserve[{i}]", "kind": "forward", "map_parent": 2, "map_index": i}
        for i in (1, 0)
    ]
    undo = {"id": 9, "name": "reserve[0]", "kind": "compensation", "map_parent": 2}
    counts = {2: {"processing": 1, "processed": 2}}
    grouped = map_items.group([load, reserve, *items, undo], counts)
    assert [s["name"] for s in grouped] == ["load", "reserve", "reserve[0]"]
    assert grouped[0]["map"] is None
    assert grouped[2]["map"] is None  # a compensation step stays a step of the run
    shape = grouped[1]["map"]
    assert [i["map_index"] for i in shape["items"]] == [0, 1]
    assert (shape["size"], shape["more"], shape["parallelism"]) == (3, 1, 2)
    assert shape["counts"] == {"processed": 2, "processing": 1}
    assert map_items.describe(shape["counts"]) == "3 items: 2 processed, 1 processing"


def test_the_runs_filter_round_trips_and_refuses_bad_values() -> None:
    query = RunQuery(("error",), "ops", "", "abc", "2026-01-02T03:04", "", (7,))
    assert query.query_string() == "state=error&workflow=ops&text=abc&since=2026-01-02T03%3A04"
    where = query.to_filter(10)
    assert (where.states, where.workflow, where.key, where.text, where.key_contains) == (
        ("error",),
        "ops",
        None,
        "abc",
        None,
    )
    assert (where.since, where.until, where.ids, where.limit) == (
        datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
        None,
        (7,),
        10,
    )
    with pytest.raises(ConsoleError, match="unknown run state 'broken'"):
        RunQuery(("broken",)).to_filter(10)
    with pytest.raises(ConsoleError, match="not YYYY-MM-DDTHH:MM"):
        RunQuery(until="yesterday").to_filter(10)


def test_after_sign_in_only_console_paths_are_followed() -> None:
    assert local("/ui/runs?state=error") == "/ui/runs?state=error"
    assert local("https://elsewhere.example/ui") == "/ui"
    assert local("//elsewhere.example/ui") == "/ui"


def _request(cookie: str | None, scheme: str = "http") -> Request:
    headers = [(b"cookie", f"{COOKIE}={cookie}".encode())] if cookie else []
    return Request(
        {
            "type": "http",
            "headers": headers,
            "scheme": scheme,
            "server": ("console.test", 443 if scheme == "https" else 80),
            "path": "/ui",
            "query_string": b"",
        }
    )


def _cookie(response: Response) -> str:
    header = response.headers["set-cookie"]
    return header.split(";")[0].split("=", 1)[1]


def test_the_session_cookie_is_signed_httponly_strict_and_secure_over_tls() -> None:
    codec = SessionCodec(b"k" * 32)
    response = Response()
    codec.write(_request(None, "https"), response, Session("c" * 8, "hash"))
    header = response.headers["set-cookie"].lower()
    assert {"httponly", "samesite=strict", "secure", "path=/ui"} <= {
        part.strip() for part in header.split(";")
    }
    value = _cookie(response)
    assert codec.read(_request(value)) == Session("c" * 8, "hash")
    assert SessionCodec(b"x" * 32).read(_request(value)) is None  # another key
    assert codec.read(_request(value[:-2] + "xx")) is None  # tampered
    plain = Response()
    codec.write(_request(None), plain, Session("c"))
    assert "secure" not in plain.headers["set-cookie"].lower()


def test_a_short_session_key_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least 16 characters"):
        Settings(api_session_secret="short")  # noqa: S106 - a refused key, not a secret


def _with_flash(value: str, *, htmx: bool = False) -> Request:
    headers = [(b"cookie", f"{flash.COOKIE}={value}".encode())]
    if htmx:
        headers.append((b"hx-request", b"true"))
    return Request({"type": "http", "headers": headers, "scheme": "http", "path": "/ui"})


def test_the_flash_is_signed_shown_once_and_left_for_the_page_by_htmx_requests() -> None:
    """The message comes back from its signed cookie; a tampered or foreign one is ignored;
    showing it clears the cookie; an htmx request neither shows nor clears it."""
    codec = flash.FlashCodec(b"k" * 32)
    response = Response()
    codec.put(_request(None), response, "Run 42 cancelled")
    header = response.headers["set-cookie"].lower()
    assert {"httponly", "samesite=strict", "path=/ui"} <= {p.strip() for p in header.split(";")}
    value = _cookie(response)
    assert codec.pending(_with_flash(value)) == "Run 42 cancelled"
    assert flash.FlashCodec(b"x" * 32).pending(_with_flash(value)) is None
    # Tamper with the signature's first character: all six of its bits count (the last one's
    # low bits are padding, so replacing the tail could leave the signature valid).
    sig = value.rindex(".") + 1
    tampered = value[:sig] + ("A" if value[sig] != "A" else "B") + value[sig + 1 :]
    assert codec.pending(_with_flash(tampered)) is None
    assert codec.pending(_with_flash(value, htmx=True)) is None
    shown = Response()
    codec.clear(_with_flash(value), shown)
    assert shown.headers["set-cookie"].startswith(f'{flash.COOKIE}=""')
    polled = Response()
    codec.clear(_with_flash(value, htmx=True), polled)
    assert "set-cookie" not in polled.headers
    long = Response()
    codec.put(_request(None), long, "x" * 2000)
    assert len(codec.pending(_with_flash(_cookie(long))) or "") == flash.MAX_CHARS


def test_the_charts_draw_bars_for_finished_runs_and_points_for_percentiles() -> None:
    """A bucket with runs is a bar (and a red one for its failures) and a point on each line;
    an empty bucket draws nothing; the axis goes up to a round number."""
    start = datetime(2026, 1, 2, 3, 0, tzinfo=UTC)
    buckets = (
        Bucket(start, finished=4, failed=1, p50_s=1.0, p95_s=2.0),
        Bucket(start + timedelta(minutes=1), finished=0, failed=0, p50_s=None, p95_s=None),
        Bucket(start + timedelta(minutes=2), finished=2, failed=0, p50_s=0.5, p95_s=0.9),
    )
    series = Series("ops", start, start + timedelta(minutes=3), 60.0, buckets)
    throughput, rate, duration = charts.charts(series)
    assert [b.css for b in throughput.bars] == ["bar", "bar-failed", "bar"]
    tallest = throughput.bars[0]
    assert [t.label for t in throughput.y_ticks] == ["0", "2.5", "5"]  # 4 on a round axis
    assert tallest.height == charts.HEIGHT * 4 / 5
    assert tallest.y + tallest.height == charts.TOP + charts.HEIGHT  # standing on the axis
    assert [len(line.points) for line in rate.lines] == [2]
    assert [p.title for p in rate.lines[0].points] == [
        "2026-01-02 03:00 UTC: 25 %",
        "2026-01-02 03:02 UTC: 0 %",
    ]
    assert [(line.label, len(line.points)) for line in duration.lines] == [("p50", 2), ("p95", 2)]
    assert not throughput.empty
    nothing = Series("ops", start, start, 60.0, (buckets[1],))
    assert all(chart.empty for chart in charts.charts(nothing))
