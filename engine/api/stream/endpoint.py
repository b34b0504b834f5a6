"""`POST /v1/stream`: SUBSCRIBE opens the subscription stream (a chunked RecordIO response);
ACKNOWLEDGE, RECONCILE, KILL and TEARDOWN are calls on other connections naming the stream in
`Sasflow-Stream-Id` (docs/api-stream.md).

SUBSCRIBE, ACKNOWLEDGE and RECONCILE need the `read` scope; KILL cancels a run the token
submitted, or any run with `operate`; TEARDOWN cancels only the token's own runs.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response, StreamingResponse

from sasflow.api.auth import Principal, require
from sasflow.api.context import ApiContext, get_context
from sasflow.api.openapi import SCHEMAS, answers
from sasflow.api.stream.calls import (
    CALL_EXAMPLES,
    Acknowledge,
    Kill,
    Reconcile,
    Subscribe,
    Teardown,
    parse_call,
)
from sasflow.api.stream.hub import StreamHub
from sasflow.errors import InvalidMessageError, StaleStreamError
from sasflow.ops import stream as ops
from sasflow.ops.submit import known_workflows
from sasflow.store.db import Connection

STREAM_ID_HEADER = "Sasflow-Stream-Id"
RECORDIO = "application/recordio"

router = APIRouter(tags=["stream"])


def get_hub(request: Request) -> StreamHub:
    """The stream hub of this server (started and closed with the app, see app.py)."""
    hub: StreamHub = request.app.state.stream_hub
    return hub


async def _json_body(request: Request) -> dict[str, Any]:
    """The decoded body, parsed here so that a malformed call is a 400 whatever is wrong
    (the API's size and nesting limits were checked before)."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidMessageError(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidMessageError("the body is not a JSON object")
    return body


@router.post(
    "/v1/stream",
    status_code=202,
    summary="Subscribe (a streaming response), or call on an open stream",
    response_class=Response,
    responses={
        200: {
            "description": "SUBSCRIBE: the stream, RecordIO records of JSON",
            "headers": {
                STREAM_ID_HEADER: {
                    "description": "The stream's id: every call on it names it.",
                    "required": True,
                    "schema": {"type": "string", "format": "uuid"},
                }
            },
            "content": {RECORDIO: {"schema": {"type": "string"}}},
        },
        202: {"description": "ACKNOWLEDGE, RECONCILE, KILL, TEARDOWN: accepted"},
        **answers(
            "invalid_call",
            "stale_stream",
            "run_not_found",
            "subscriber_not_found",
            "invalid_action",
            body=True,
        ),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": SCHEMAS + "StreamCall"},
                    "examples": CALL_EXAMPLES,
                }
            },
        }
    },
)
def stream_call(
    principal: Annotated[Principal, Depends(require("read"))],
    request_body: Annotated[dict[str, Any], Depends(_json_body)],
    ctx: Annotated[ApiContext, Depends(get_context)],
    hub: Annotated[StreamHub, Depends(get_hub)],
    stream_id: Annotated[str | None, Header(alias=STREAM_ID_HEADER)] = None,
) -> Response:
    """SUBSCRIBE answers 200 with the stream; the other calls 202 (docs/api-stream.md)."""
    call = parse_call(request_body)
    if isinstance(call, Subscribe):
        return _subscribe(call, principal, ctx, hub)
    if stream_id is None:
        raise StaleStreamError(f"{call.type} needs the {STREAM_ID_HEADER} header of a stream")
    call_on_stream(ctx, call, stream_id, principal)
    hub.wake()  # this server's streams at once, without waiting for NOTIFY
    return Response(status_code=202)


def call_on_stream(
    ctx: ApiContext,
    call: Acknowledge | Reconcile | Kill | Teardown,
    stream_id: str,
    principal: Principal,
) -> None:
    """Carry out one call in one transaction, retried on a deadlock (an ACKNOWLEDGE deletes
    rows a stream may be marking sent)."""
    namespace = ctx.namespace
    owner = principal.name

    def work(conn: Connection) -> None:
        match call:
            case Acknowledge():
                ops.acknowledge(conn, stream_id, call.all(), owner=owner)
            case Reconcile():
                ops.reconcile(conn, stream_id, call.runs, owner=owner, namespace=namespace)
            case Kill():
                may_operate = principal.may("operate")
                ops.kill(
                    conn,
                    stream_id,
                    call.run,
                    owner=owner,
                    may_operate=may_operate,
                    namespace=namespace,
                )
            case Teardown():
                ops.teardown(conn, stream_id, owner=owner, namespace=namespace)

    ctx.transaction(work)


def _subscribe(
    call: Subscribe, principal: Principal, ctx: ApiContext, hub: StreamHub
) -> StreamingResponse:
    known = known_workflows(ctx.registry)
    unknown = sorted(set(call.filter.workflows or ()) - set(known))
    if unknown:
        # A typo in the filter would otherwise be a stream that never says anything.
        raise InvalidMessageError(
            f"filter.workflows: unknown {', '.join(unknown)}; known: {', '.join(known) or 'none'}"
        )
    subscriber, stream_id = ctx.transaction(
        lambda conn: ops.subscribe(
            conn,
            name=call.subscriber.name,
            subscriber_id=call.subscriber.id,
            where=call.filter.filter(),
            owner=principal.name,
            namespace=ctx.namespace,
        )
    )
    hub.wake()
    return StreamingResponse(
        hub.records(subscriber.id, stream_id),
        media_type=RECORDIO,
        headers={STREAM_ID_HEADER: stream_id, "Cache-Control": "no-store"},
    )
