"""Every `error` code the HTTP API answers, with its status: the one list that the error
handlers (errors.py), the OpenAPI document (openapi.py) and docs/api.md's table agree on (a
test checks all three)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    """An error code: its HTTP `status`, when it is answered, and a message it may carry."""

    status: int
    when: str
    example: str


CODES: dict[str, Code] = {
    "invalid_json": Code(
        400, "the body is not JSON (or not UTF-8)", "the request body is not JSON"
    ),
    "too_deeply_nested": Code(
        400,
        "the body nests JSON deeper than SASFLOW_API_MAX_JSON_DEPTH (checked before parsing)",
        "the request body nests JSON deeper than 64 levels",
    ),
    "invalid_input": Code(
        400,
        "the engine refuses the input as a whole (too large as a submission, not buildable, "
        "a limit it cannot apply)",
        "invalid submission: message of 2000000 bytes exceeds the limit of 1048576 bytes "
        "(SASFLOW_MAX_MESSAGE_BYTES)",
    ),
    "callbacks_disabled": Code(
        400,
        "a callback_url, but this server has no SASFLOW_API_CALLBACK_SECRET to sign callbacks",
        "this server has no callback key (SASFLOW_API_CALLBACK_SECRET): it cannot sign "
        "callbacks, so it refuses runs with a callback_url",
    ),
    "invalid_call": Code(
        400,
        "a malformed call on the subscription stream (docs/api-stream.md)",
        "subscriber.name: Field required",
    ),
    "bad_request": Code(400, "a request the server cannot read otherwise", "bad request"),
    "unauthorized": Code(
        401,
        "no Authorization header, or not `Bearer TOKEN`",
        "no token: send Authorization: Bearer TOKEN",
    ),
    "invalid_token": Code(
        401, "the token is unknown or revoked", "the token is unknown or revoked"
    ),
    "forbidden": Code(
        403,
        "the token lacks the scope the operation needs",
        "token 'reader' lacks the 'submit' scope (it has: read)",
    ),
    "stale_stream": Code(
        403,
        "no current stream of this token has that Sasflow-Stream-Id (ended, replaced, never)",
        "stream 4f1c... is not a current stream of token 'shop'",
    ),
    "not_found": Code(404, "no such path", "Not Found"),
    "run_not_found": Code(404, "no run with that id", "no run with id 7"),
    "alert_not_found": Code(404, "no alert with that id", "no alert with id 7"),
    "incident_not_found": Code(404, "no incident with that id", "no incident with id 7"),
    "unknown_workflow": Code(
        404,
        "no workflow of that name (and version); adds `known`, the names this server knows",
        "unknown workflow 'ordr'; known workflows: order",
    ),
    "schedule_not_found": Code(
        404, "no schedule with that id or name", "no schedule with id or name 'nightly'"
    ),
    "scheduler_not_found": Code(
        404, "no scheduler registered with that name", "no scheduler named 's1' is registered"
    ),
    "limit_not_found": Code(404, "no flow limit of that name", "no flow limit named 'payments'"),
    "subscriber_not_found": Code(
        404,
        "no subscriber of this token with that id (subscription stream)",
        "no subscriber 4f1c... of token 'shop'",
    ),
    "approval_not_found": Code(
        404, "the run has no approval step of that name", "run 7 has no approval step 'refund'"
    ),
    "token_not_found": Code(404, "no live token of that name", "no live token named 'shop'"),
    "method_not_allowed": Code(
        405, "the path has no such method; header `Allow` lists its methods", "Method Not Allowed"
    ),
    "request_timeout": Code(
        408,
        "the body did not arrive within SASFLOW_API_BODY_TIMEOUT_S; the connection is closed",
        "the request body did not arrive within 30 seconds",
    ),
    "invalid_action": Code(
        409,
        "the state does not allow the action (cancel a finished run, pause a paused schedule...)",
        "run 7 is completed: only pending or running runs can be cancelled",
    ),
    "already_acknowledged": Code(
        409,
        "the alert or incident was acknowledged already (says by whom)",
        "alert 7 is already acknowledged (by ops at 2026-01-01T00:00:00+00:00: known)",
    ),
    "conflict": Code(409, "another conflict with the resource's state", "Conflict"),
    "body_too_large": Code(
        413,
        "the body is larger than SASFLOW_API_MAX_BODY_BYTES",
        "the request body is larger than 1048576 bytes",
    ),
    "unsupported_media_type": Code(
        415, "the body's media type cannot be read", "Unsupported Media Type"
    ),
    "validation_error": Code(
        422,
        "a field is wrong, or holds what the database cannot store; adds `fields`, one "
        "`{field, message}` per problem",
        "body.priority: Input should be a valid integer",
    ),
    "backlog_full": Code(
        429,
        "the workflow's backlog is at its bound; header `Retry-After` (seconds); adds "
        "`workflow`, `backlog`, `max_backlog`, `retry_after`",
        "workflow 'order' has 10000 run(s) waiting to start, its bound is 10000 (max_backlog): "
        "submit again in 5s",
    ),
    "internal_error": Code(500, "a bug: the server's log has the traceback", "internal error"),
    "store_unavailable": Code(
        503, "the database cannot do the work now: retry later", "the database is unavailable"
    ),
    "broker_unavailable": Code(
        503, "the broker cannot be reached (`/readyz`)", "the broker is unavailable"
    ),
    "unavailable": Code(503, "another temporary failure: retry later", "Service Unavailable"),
}


def status_of(code: str) -> int:
    """The HTTP status of `code` (KeyError for a code missing from CODES: a bug)."""
    return CODES[code].status
