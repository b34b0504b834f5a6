"""The wire protocol: parsing and validating messages, encoding them, dumping JSON values."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sasflow.errors import InvalidMessageError
from sasflow.messages import ErrorInfo, Reply, Request, Submission, dumps, parse
from sasflow.states import ReplyStatus


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


REQUEST: dict[str, Any] = {
    "step_id": 7,
    "run_id": 3,
    "attempt": 2,
    "workflow": "order",
    "step": "pay",
    "agent": "billing",
    "action": "charge",
    "input": {"amount": 10},
    "idempotency_key": "run-3-step-pay",
    "budget_ms": 5000,
    "complete_by": "2024-01-01T00:00:05+00:00",
}


def test_parse_valid_submission_with_defaults() -> None:
    """A minimal submission gets the documented defaults."""
    sub = parse(Submission, b'{"workflow": "order"}')

    assert (
        Submission(workflow="order", input={}, key=None, priority=0, reply_to=None, version=None)
        == sub
    )


def test_parse_valid_submission_with_all_fields() -> None:
    """Every submission field is read."""
    sub = parse(
        Submission,
        _body(
            workflow="order",
            input={"id": 1},
            key="o-1",
            priority=-5,
            reply_to="app.status",
            version=2,
        ),
    )

    assert (sub.input, sub.key, sub.priority, sub.reply_to, sub.version) == (
        {"id": 1},
        "o-1",
        -5,
        "app.status",
        2,
    )


def test_parse_ignores_unknown_fields() -> None:
    """Extra fields are ignored, so newer producers can add fields."""
    sub = parse(Submission, _body(workflow="order", future_field=True))

    assert sub.workflow == "order"


def test_parse_valid_request() -> None:
    """A complete request parses with kind defaulting to forward."""
    req = parse(Request, _body(**REQUEST))

    assert (
        req.step_id,
        req.run_id,
        req.attempt,
        req.action,
        req.input,
        req.budget_ms,
        req.kind,
        req.v,
    ) == (7, 3, 2, "charge", {"amount": 10}, 5000, "forward", 1)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"status": "ok", "output": {"x": 1}}, ("ok", {"x": 1}, None, None)),
        (
            {"status": "error", "error": {"type": "Boom", "message": "no"}},
            ("error", None, ErrorInfo(type="Boom", message="no"), None),
        ),
        ({"status": "deferred", "defer_seconds": 2.5}, ("deferred", None, None, 2.5)),
    ],
)
def test_parse_valid_replies(fields: dict[str, Any], expected: tuple[Any, ...]) -> None:
    """ok, error and deferred replies parse with their status-specific fields."""
    reply = parse(Reply, _body(step_id=1, attempt=1, **fields))

    assert expected == (reply.status, reply.output, reply.error, reply.defer_seconds)


@pytest.mark.parametrize("status", list(ReplyStatus))
def test_a_reply_status_is_the_enum_member_and_travels_as_its_string(
    status: ReplyStatus,
) -> None:
    """A parsed status is the ReplyStatus member; encoded, it is the plain string it came as,
    and the store's outcome kind is the same member."""
    fields: dict[str, Any] = {"error": {"type": "T", "message": "m"}, "defer_seconds": 1.0}
    body = _body(step_id=1, attempt=1, status=status.value, **fields)

    reply = parse(Reply, body)

    assert status is reply.status
    assert f'"status":"{status.value}"' in reply.encode().decode()
    assert status is reply.outcome().kind


def test_an_unknown_reply_status_is_named_with_the_known_ones() -> None:
    """A misspelt status is refused with the four that exist, in the dead-letter reason."""
    with pytest.raises(InvalidMessageError) as info:
        parse(Reply, _body(step_id=1, attempt=1, status="okay"))

    assert str(info.value) == (
        "Reply: status: Input should be 'ok', 'error', 'failed' or 'deferred'"
    )


def test_non_utf8_body_is_invalid() -> None:
    """Bytes that are not UTF-8 are rejected with a reason naming the message type."""
    with pytest.raises(InvalidMessageError, match=r"^Submission: body is not UTF-8 JSON"):
        parse(Submission, b'{"workflow": "\xff\xfe"}')


def test_utf16_body_is_invalid() -> None:
    """The protocol is UTF-8 JSON: a UTF-16 body is rejected."""
    with pytest.raises(InvalidMessageError, match="UTF-8"):
        parse(Submission, '{"workflow": "order"}'.encode("utf-16"))


def test_nan_token_in_body_is_invalid() -> None:
    """NaN is not JSON: a body containing it is rejected."""
    with pytest.raises(InvalidMessageError):
        parse(Submission, b'{"workflow": "order", "input": {"amount": NaN}}')


@pytest.mark.parametrize("body", [b"", b"{", b"not json", b"{'workflow': 'x'}"])
def test_non_json_body_is_invalid(body: bytes) -> None:
    """A body that is not JSON is rejected with a reason."""
    with pytest.raises(InvalidMessageError, match=r"^Request: body is not UTF-8 JSON: "):
        parse(Request, body)


@pytest.mark.parametrize(
    ("body", "kind"), [(b"[1, 2]", "list"), (b'"x"', "str"), (b"3", "int"), (b"null", "NoneType")]
)
def test_json_that_is_not_an_object_is_invalid(body: bytes, kind: str) -> None:
    """A JSON array or scalar is rejected, naming what was received."""
    with pytest.raises(InvalidMessageError) as info:
        parse(Reply, body)

    assert f"Reply: body must be a JSON object, got {kind}" == str(info.value)


def test_missing_fields_are_listed() -> None:
    """Each missing required field is named in the reason."""
    with pytest.raises(InvalidMessageError) as info:
        parse(Reply, b'{"status": "ok"}')

    assert str(info.value) == "Reply: step_id: Field required; attempt: Field required"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step_id", "seven"),
        ("budget_ms", [1]),
        ("workflow", 123),
        ("kind", "sideways"),
        ("step_id", 0),
        ("budget_ms", -1),
        ("idempotency_key", ""),
    ],
)
def test_wrong_types_and_values_in_a_request_are_named(field: str, value: Any) -> None:
    """A field of the wrong type or out of range is named in the reason."""
    with pytest.raises(InvalidMessageError, match=rf"^Request: {field}: "):
        parse(Request, _body(**{**REQUEST, field: value}))


@pytest.mark.parametrize("name", ["", "has space", "-x", "a" * 101, "w\n"])
def test_bad_workflow_name_in_a_submission_is_invalid(name: str) -> None:
    """The submitted workflow name must match the name pattern."""
    with pytest.raises(InvalidMessageError, match=r"^Submission: workflow: String should match"):
        parse(Submission, _body(workflow=name))


@pytest.mark.parametrize("priority", [-1001, 1001])
def test_priority_out_of_range_is_invalid(priority: int) -> None:
    """Priorities lie within -1000..1000."""
    with pytest.raises(InvalidMessageError, match=r"^Submission: priority: "):
        parse(Submission, _body(workflow="order", priority=priority))


@pytest.mark.parametrize("priority", [-1000, 1000])
def test_priority_bounds_are_valid(priority: int) -> None:
    """-1000 and 1000 are accepted."""
    assert priority == parse(Submission, _body(workflow="order", priority=priority)).priority


def test_error_reply_without_error_object_is_invalid() -> None:
    """An 'error' reply must say what the error was."""
    with pytest.raises(InvalidMessageError) as info:
        parse(Reply, _body(step_id=1, attempt=1, status="error"))

    assert "an 'error' reply needs an 'error' object" in str(info.value)
    assert str(info.value).startswith("Reply: <message>: ")


def test_deferred_reply_without_defer_seconds_is_invalid() -> None:
    """A 'deferred' reply must say for how long."""
    with pytest.raises(InvalidMessageError, match=r"a 'deferred' reply needs 'defer_seconds'"):
        parse(Reply, _body(step_id=1, attempt=1, status="deferred"))


@pytest.mark.parametrize("seconds", [-1, 86400 * 7 + 1])
def test_defer_seconds_out_of_range_is_invalid(seconds: float) -> None:
    """defer_seconds lies within 0..7 days."""
    with pytest.raises(InvalidMessageError, match=r"^Reply: defer_seconds: "):
        parse(Reply, _body(step_id=1, attempt=1, status="deferred", defer_seconds=seconds))


def test_unknown_protocol_version_is_invalid() -> None:
    """Only protocol version 1 is understood."""
    with pytest.raises(InvalidMessageError, match=r"^Reply: v: "):
        parse(Reply, _body(v=2, step_id=1, attempt=1, status="ok"))


@pytest.mark.parametrize(
    "message",
    [
        Submission(
            workflow="order",
            input={"a": [1, 2.5, None, "é"]},
            key="k",
            priority=3,
            reply_to="q",
            version=4,
        ),
        Request.model_validate({**REQUEST, "kind": "compensation"}),
        Reply(
            step_id=9,
            attempt=2,
            status="error",
            error=ErrorInfo(type="T", message="m"),
            agent="billing",
        ),
        Reply(step_id=9, attempt=2, status="deferred", defer_seconds=1.5),
    ],
)
def test_encode_then_parse_round_trips(message: Submission | Request | Reply) -> None:
    """parse(type, m.encode()) gives back an equal message."""
    assert message == parse(type(message), message.encode())


def test_encode_is_utf8_json_with_every_field() -> None:
    """encode() writes UTF-8 JSON including the None fields."""
    data = json.loads(Submission(workflow="order", input={"name": "é"}).encode().decode("utf-8"))

    assert data == {
        "workflow": "order",
        "input": {"name": "é"},
        "key": None,
        "priority": 0,
        "reply_to": None,
        "version": None,
        "start_at": None,
    }


def test_messages_are_frozen() -> None:
    """A parsed message cannot be modified."""
    sub = parse(Submission, b'{"workflow": "order"}')

    with pytest.raises(ValueError, match="frozen"):
        sub.workflow = "other"  # type: ignore[misc]


def test_dumps_is_compact_json() -> None:
    """dumps writes JSON without spaces."""
    assert dumps({"a": [1, 2], "b": None}) == '{"a":[1,2],"b":null}'


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, {"x": [math.nan]}])
def test_dumps_rejects_nan_and_infinity(value: Any) -> None:
    """NaN and infinities are not JSON."""
    with pytest.raises(InvalidMessageError, match=r"^value is not JSON: "):
        dumps(value)


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", {"k": object()}, {(1, 2): 3}])
def test_dumps_rejects_non_serialisable_values(value: Any) -> None:
    """Values json cannot serialise are an InvalidMessageError, not a TypeError."""
    with pytest.raises(InvalidMessageError, match=r"^value is not JSON: "):
        dumps(value)
