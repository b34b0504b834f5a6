"""One error shape for every error the API answers: `{"error": code, "message": ...}`.

Validation errors add `fields` (`[{"field": "body.priority", "message": ...}]`). The body
limits are checked by a small ASGI middleware before anything parses the body: larger than
`api_max_body_bytes` -> 413, JSON nested deeper than `api_max_json_depth` -> 400.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sasflow import errors
from sasflow.api.validation import NUL_MESSAGE, nul_fields, nul_problems
from sasflow.messages import nesting

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


# What each sasflow error from the service layer means over HTTP.
_SASFLOW_ERRORS: tuple[tuple[type[errors.SasflowError], int, str], ...] = (
    (errors.RunNotFoundError, 404, "run_not_found"),
    (errors.AlertNotFoundError, 404, "alert_not_found"),
    (errors.UnknownWorkflowError, 404, "unknown_workflow"),
    (errors.TokenNotFoundError, 404, "token_not_found"),
    (errors.ScheduleNotFoundError, 404, "schedule_not_found"),
    (errors.SchedulerNotFoundError, 404, "scheduler_not_found"),
    (errors.LimitNotFoundError, 404, "limit_not_found"),
    (errors.AlertAlreadyAcknowledgedError, 409, "already_acknowledged"),
    (errors.InvalidActionError, 409, "invalid_action"),
    (errors.InvalidInputError, 400, "invalid_input"),
    (errors.InvalidAcknowledgementError, 400, "invalid_input"),
    (errors.InvalidTokenError, 400, "invalid_input"),
    (errors.InvalidLimitError, 400, "invalid_input"),
    (errors.StaleStreamError, 403, "stale_stream"),
    (errors.SubscriberNotFoundError, 404, "subscriber_not_found"),
    (errors.InvalidMessageError, 400, "invalid_call"),
    (errors.StoreUnavailableError, 503, "store_unavailable"),
    (errors.BrokerUnavailableError, 503, "broker_unavailable"),
)

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


def to_response(exc: Exception) -> JSONResponse:
    """The error answer for any exception a request raised."""
    match exc:
        case ApiError():
            return error_response(
                exc.status, exc.code, exc.message, headers=exc.headers, extra=exc.extra
            )
        case RequestValidationError():
            return _validation_error(exc)
        case StarletteHTTPException():
            code = _STATUS_CODES.get(exc.status_code, f"http_{exc.status_code}")
            return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)
        case errors.SasflowError():
            for kind, status, name in _SASFLOW_ERRORS:
                if isinstance(exc, kind):
                    return error_response(status, name, str(exc))
            log.error("unexpected sasflow error: %s", exc, exc_info=exc)
            return error_response(500, "internal_error", str(exc))
        case _:
            log.error("unexpected error: %s", exc, exc_info=exc)
            return error_response(500, "internal_error", "internal error (see the server's log)")


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    problems = list(exc.errors())
    if any(p.get("type") == "json_invalid" for p in problems):
        return error_response(400, "invalid_json", "the request body is not valid JSON")
    fields = [
        {"field": ".".join(str(part) for part in p.get("loc", ())), "message": p.get("msg", "")}
        for p in problems
    ]
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    return error_response(422, "validation_error", summary, extra={"fields": fields})


def _handle(_: Request, exc: Exception) -> JSONResponse:
    return to_response(exc)


def install(app: FastAPI, *, max_body_bytes: int, max_json_depth: int) -> None:
    """Register the error handlers and the body limits on `app`."""
    for kind in (ApiError, StarletteHTTPException, RequestValidationError, errors.SasflowError):
        app.add_exception_handler(kind, _handle)
    app.add_exception_handler(Exception, _handle)  # a bug: 500 in the same shape
    app.add_middleware(BodyLimits, max_body_bytes=max_body_bytes, max_json_depth=max_json_depth)


class BodyLimits:
    """Read a request's body up front (at most `max_body_bytes`), refuse a JSON body nested
    deeper than `max_json_depth`, then hand the body on; later `receive` calls (a client
    disconnecting from a stream) pass through."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_json_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = error_response(
            413,
            "body_too_large",
            f"the request body is larger than {self.max_body_bytes} bytes",
        )
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if nuls := nul_fields(body):
            refused = error_response(
                422,
                "validation_error",
                f"{', '.join(nuls)}: {NUL_MESSAGE}",
                extra={"fields": nul_problems(nuls)},
            )
            await refused(scope, receive, send)
            return
        if body and nesting(body, self.max_json_depth) > self.max_json_depth:
            deep = error_response(
                400,
                "too_deeply_nested",
                f"the request body nests JSON deeper than {self.max_json_depth} levels",
            )
            await deep(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
