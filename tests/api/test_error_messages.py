"""What an error message may say (no server): one line, without the database driver's text.
A 503 says the database (or broker) is unavailable and the log has the driver's words (hosts,
DETAIL lines of a deadlock); any other message of the engine is cut at its first line, so a
PostgreSQL DETAIL or a multi-line dump never reaches a client; a bug says only that."""

from __future__ import annotations

import json
import logging

import pytest
from starlette.exceptions import HTTPException

from sasflow import errors
from sasflow.api.errors import to_response

DRIVER_TEXT = (
    'duplicate key value violates unique constraint "flow_limits_pkey"\n'
    "DETAIL:  Key (name)=(payments) already exists."
)


def _answer(exc: Exception) -> tuple[int, dict[str, object]]:
    response = to_response(exc)
    return response.status_code, json.loads(bytes(response.body))


@pytest.mark.parametrize(
    "exc",
    [
        errors.StoreUnavailableError(
            'state store unavailable: connection to server at "10.0.0.7", port 5432 failed'
        ),
        errors.ConflictError(f"concurrent update, retry: deadlock detected\n{DRIVER_TEXT}"),
    ],
)
def test_a_503_keeps_the_driver_in_the_log(
    exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sasflow.api.errors"):
        status, body = _answer(exc)
    assert (status, body) == (
        503,
        {"error": "store_unavailable", "message": "the database is unavailable: try again later"},
    )
    assert str(exc) in caplog.text


def test_an_engine_message_is_one_line() -> None:
    exc = errors.InvalidInputError(f"database rejected the submission: {DRIVER_TEXT}")
    assert _answer(exc) == (
        400,
        {
            "error": "invalid_input",
            "message": "database rejected the submission: duplicate key value violates unique "
            'constraint "flow_limits_pkey"',
        },
    )


def test_a_bug_says_only_that() -> None:
    assert _answer(errors.LeaseLostError(DRIVER_TEXT)) == (
        500,
        {"error": "internal_error", "message": "internal error (see the server's log)"},
    )
    assert _answer(KeyError(DRIVER_TEXT))[1]["message"] == "internal error (see the server's log)"


def test_a_body_fastapi_cannot_decode_is_invalid_json() -> None:
    assert _answer(HTTPException(400, "There was an error parsing the body")) == (
        400,
        {"error": "invalid_json", "message": "the request body is not JSON"},
    )
    assert _answer(HTTPException(400, "bad form")) == (
        400,
        {"error": "bad_request", "message": "bad form"},
    )
