"""The bodies of `POST /v1/stream`: one JSON call with a `type` field (docs/api-stream.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from sasflow.errors import InvalidMessageError
from sasflow.ops.stream import RECONCILE_LIMIT, StreamFilter

_UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_NAME = r"^[A-Za-z0-9_.:@/ -]{1,200}$"
_RUN_ID = Annotated[int, Field(ge=1, le=2**63 - 1)]


class _Call(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SubscriberBody(_Call):
    name: str = Field(pattern=_NAME, description="A name for operators: the client's.")
    id: str | None = Field(
        default=None,
        pattern=_UUID,
        description="A known subscriber's id: the call is a reconnection.",
    )


class FilterBody(_Call):
    workflows: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        default=None, max_length=1000, description="Only runs of these workflows (all if absent)."
    )
    runs_submitted_by_me: bool = Field(
        default=False, description="Only runs submitted with this token."
    )

    def filter(self) -> StreamFilter:
        workflows = None if self.workflows is None else tuple(self.workflows)
        return StreamFilter(workflows, self.runs_submitted_by_me)


class Subscribe(_Call):
    type: Literal["SUBSCRIBE"]
    subscriber: SubscriberBody
    filter: FilterBody = FilterBody()


ACK_BATCH = 1000
"""Most updates one ACKNOWLEDGE may name (`uuids`)."""


class Acknowledge(_Call):
    """`uuid`: one update; or `uuids`: several at once (what the SDK sends, to keep up with a
    busy stream on one connection)."""

    type: Literal["ACKNOWLEDGE"]
    uuid: str | None = Field(default=None, pattern=_UUID)
    uuids: list[Annotated[str, Field(pattern=_UUID)]] | None = Field(
        default=None, min_length=1, max_length=ACK_BATCH
    )

    @model_validator(mode="after")
    def _one_form(self) -> Acknowledge:
        if (self.uuid is None) == (self.uuids is None):
            raise ValueError("give either uuid or uuids")
        return self

    def all(self) -> list[str]:
        return [self.uuid] if self.uuid is not None else list(self.uuids or ())


class Reconcile(_Call):
    type: Literal["RECONCILE"]
    runs: list[_RUN_ID] = Field(default_factory=list, max_length=RECONCILE_LIMIT)


class Kill(_Call):
    type: Literal["KILL"]
    run: _RUN_ID


class Teardown(_Call):
    type: Literal["TEARDOWN"]


StreamCall = Annotated[
    Subscribe | Acknowledge | Reconcile | Kill | Teardown, Field(discriminator="type")
]
_CALL: TypeAdapter[Subscribe | Acknowledge | Reconcile | Kill | Teardown] = TypeAdapter(StreamCall)


def parse_call(body: Any) -> Subscribe | Acknowledge | Reconcile | Kill | Teardown:
    """The call in a decoded JSON body; InvalidMessageError naming the field otherwise."""
    try:
        return _CALL.validate_python(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidMessageError(f"{where}: {first['msg']}") from exc


_STREAM_ID = "5f0c6a9e-7d8b-4c1e-9a2f-3b4c5d6e7f80"
CALL_EXAMPLES: dict[str, dict[str, Any]] = {
    "subscribe": {
        "summary": "SUBSCRIBE: open the stream (a new subscriber)",
        "value": {
            "type": "SUBSCRIBE",
            "subscriber": {"name": "billing-controller"},
            "filter": {"workflows": ["order"], "runs_submitted_by_me": True},
        },
    },
    "acknowledge": {
        "summary": "ACKNOWLEDGE an update (header Sasflow-Stream-Id)",
        "value": {"type": "ACKNOWLEDGE", "uuid": _STREAM_ID},
    },
    "reconcile": {
        "summary": "RECONCILE: send these runs' states again",
        "value": {"type": "RECONCILE", "runs": [17, 18]},
    },
    "kill": {"summary": "KILL: cancel a run", "value": {"type": "KILL", "run": 17}},
    "teardown": {
        "summary": "TEARDOWN: cancel the subscriber's runs and end it",
        "value": {"type": "TEARDOWN"},
    },
}
"""The examples of `POST /v1/stream`'s body in the OpenAPI document."""
