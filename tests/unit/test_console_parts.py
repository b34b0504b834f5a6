"""The console's parts that need no server: the DAG layout, the runs filter as it travels in
forms, the signed session cookie."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from sasflow.api.console import dag
from sasflow.api.console.session import COOKIE, Session, SessionCodec
from sasflow.api.console.views import ConsoleError, RunQuery, local
from sasflow.settings import Settings


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


def test_the_runs_filter_round_trips_and_refuses_bad_values() -> None:
    query = RunQuery(("error",), "ops", "", "abc", "2026-01-02T03:04", "", (7,))
    assert query.query_string() == "state=error&workflow=ops&text=abc&since=2026-01-02T03%3A04"
    where = query.to_filter(10)
    assert (where.states, where.workflow, where.key, where.key_contains) == (
        ("error",),
        "ops",
        None,
        "abc",
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
