"""One error shape for every error the API answers: `{"error": code, "message": ...}`.

Validation errors add `fields` (`[{"field": "body.priority", "message": ...}]`). Each code and
its status are in codes.py. A message is one line: the text of a database driver (hosts,
DETAIL lines) and pydantic's dumps stay in the server's log. The body limits are body.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

from sasflow import errors
from sasflow.api.codes import status_of
from sasflow.messages import field_problems

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answer: HTTP `status`, a stable `code` and a message for people."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    return JSONResponse(
        {"error": code, "message": message, **(extra or {})},
        status_code=status,
        headers=dict(headers or {}),
    )


# What each sasflow error from the service layer means over HTTP (its status: codes.py).
_SASFLOW_ERRORS: tuple[tuple[type[errors.SasflowError], str], ...] = (
    (errors.RunNotFoundError, "run_not_found"),
    (errors.AlertNotFoundError, "alert_not_found"),
    (errors.IncidentNotFoundError, "incident_not_found"),
    (errors.UnknownWorkflowError, "unknown_workflow"),
    (errors.TokenNotFoundError, "token_not_found"),
    (errors.ApprovalNotFoundError, "approval_not_found"),
    (errors.ScheduleNotFoundError, "schedule_not_found"),
    (errors.SchedulerNotFoundError, "scheduler_not_found"),
    (errors.LimitNotFoundError, "limit_not_found"),
    (errors.AlertAlreadyAcknowledgedError, "already_acknowledged"),
    (errors.IncidentAlreadyAcknowledgedError, "already_acknowledged"),
    (errors.InvalidActionError, "invalid_action"),
    (errors.ApprovalForbiddenError, "forbidden"),
    (errors.InvalidFormError, "validation_error"),
    (errors.InvalidInputError, "invalid_input"),
    (errors.InvalidAcknowledgementError, "invalid_input"),
    (errors.InvalidTokenError, "invalid_input"),
    (errors.InvalidLimitError, "invalid_input"),
    (errors.StaleStreamError, "stale_stream"),
    (errors.SubscriberNotFoundError, "subscriber_not_found"),
    (errors.InvalidMessageError, "invalid_call"),
    (errors.StoreUnavailableError, "store_unavailable"),
    (errors.BrokerUnavailableError, "broker_unavailable"),
)

# The code of an HTTP error the framework raised (routing, body parsing), by status.
_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    503: "unavailable",
}
_UNPARSED_BODY = "There was an error parsing the body"
"""FastAPI's detail of a JSON body it could not decode (e.g. not UTF-8)."""
NOT_JSON = "the request body is not JSON"
UNAVAILABLE = {
    "store_unavailable": "the database is unavailable: try again later",
    "broker_unavailable": "the broker is unavailable: try again later",
}
"""What a 503 says: the driver's text (hosts, ports, DETAIL) goes to the server's log only."""


def unavailable_message(code: str, exc: Exception) -> str:
    """A 503's message: the fixed text, except for a schema not at head, whose sentence names
    two revisions and the command that fixes it (`sasflow db upgrade`), nothing of the driver."""
    if isinstance(exc, errors.SchemaOutdatedError):
        return first_line(str(exc))
    return UNAVAILABLE[code]


def to_response(exc: Exception) -> JSONResponse:
    """The error answer for any exception a request raised."""
    match exc:
        case ApiError():
            return error_response(
                exc.status, exc.code, exc.message, headers=exc.headers, extra=exc.extra
            )
        case RequestValidationError():
            return _validation_error(exc)
        case StarletteHTTPException(status_code=400, detail=detail) if detail == _UNPARSED_BODY:
            return error_response(400, "invalid_json", NOT_JSON)
        case StarletteHTTPException():
            code = _STATUS_CODES.get(exc.status_code, f"http_{exc.status_code}")
            return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)
        case errors.SasflowError():
            return _sasflow_error(exc)
        case _:
            log.error("unexpected error: %s", exc, exc_info=exc)
            return error_response(500, "internal_error", "internal error (see the server's log)")


def _sasflow_error(exc: errors.SasflowError) -> JSONResponse:
    for kind, code in _SASFLOW_ERRORS:
        if isinstance(exc, kind):
            if code in UNAVAILABLE:
                if not isinstance(exc, errors.SchemaOutdatedError):  # said once, by the watch
                    log.warning("answered 503 %s: %s", code, exc)
                return error_response(status_of(code), code, unavailable_message(code, exc))
            message = first_line(str(exc))
            if message != str(exc):
                log.info("answered %s with its first line: %s", code, exc)
            return error_response(status_of(code), code, message)
    log.error("unexpected sasflow error: %s", exc, exc_info=exc)
    return error_response(500, "internal_error", "internal error (see the server's log)")


def first_line(message: str) -> str:
    """`message` up to its first line break: a driver's DETAIL, HINT or CONTEXT lines and the
    rest of a multi-line dump stay in the server's log."""
    return message.strip().split("\n", 1)[0].rstrip()


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    problems = list(exc.errors())
    if any(p.get("type") == "json_invalid" for p in problems):
        return error_response(400, "invalid_json", NOT_JSON)
    fields = [
        {"field": field, "message": message}
        for field, message in field_problems(problems, whole="")
    ]
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    return error_response(422, "validation_error", summary, extra={"fields": fields})


def _handle(request: Request, exc: Exception) -> JSONResponse:
    answer = to_response(exc)
    if answer.status_code == 405 and (methods := allowed_methods(request)):
        answer.headers["Allow"] = ", ".join(methods)
    return answer


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (Starlette's own 405 names only
    the methods of the first route that matched the path); [] when only a mount (the
    console's static files) serves it."""
    routes = [route for route in request.app.router.routes if not isinstance(route, Mount)]
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]


def install(app: FastAPI) -> None:
    """Register the error handlers on `app`."""
    for kind in (ApiError, StarletteHTTPException, RequestValidationError, errors.SasflowError):
        app.add_exception_handler(kind, _handle)
    app.add_exception_handler(Exception, _handle)  # a bug: 500 in the same shape
