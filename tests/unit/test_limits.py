"""Message limits: the largest body and the deepest nesting, checked before decoding; the run
input must be a JSON object. Each refusal names the limit and its setting."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sasflow.agents.agent import Call
from sasflow.agents.jobs import Job, Outcome
from sasflow.cli.main import cli
from sasflow.errors import ConfigurationError, InvalidMessageError
from sasflow.messages import (
    DEFAULT_LIMITS,
    Limits,
    Reply,
    Request,
    Submission,
    encode_within,
    nesting,
    parse,
    value_depth,
)
from sasflow.settings import Settings
from sasflow.transport.base import Delivery

SIZE_REASON = (
    "message of {size} bytes exceeds the limit of {limit} bytes (SASFLOW_MAX_MESSAGE_BYTES)"
)


def _submission_of(size: int) -> bytes:
    """A valid submission body of exactly `size` bytes."""
    head, tail = b'{"workflow":"w","input":{"s":"', b'"}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _nested(depth: int) -> bytes:
    """A submission whose whole body nests `depth` levels (the envelope is level 1)."""
    inner = b"[" * (depth - 2) + b"]" * (depth - 2)
    return b'{"workflow":"w","input":{"a":' + inner + b"}}"


def test_defaults_are_one_mebibyte_and_depth_64() -> None:
    assert (DEFAULT_LIMITS.max_message_bytes, DEFAULT_LIMITS.max_json_depth) == (1048576, 64)
    assert Settings().limits() == DEFAULT_LIMITS


def test_a_body_at_the_size_limit_is_accepted_and_one_byte_more_is_refused() -> None:
    limit = DEFAULT_LIMITS.max_message_bytes
    assert parse(Submission, _submission_of(limit)).workflow == "w"
    with pytest.raises(InvalidMessageError) as refused:
        parse(Submission, _submission_of(limit + 1))
    expected = "Submission: " + SIZE_REASON.format(size=limit + 1, limit=limit)
    assert str(refused.value) == expected


def test_the_size_is_checked_before_the_body_is_decoded() -> None:
    """40 MB that is not even UTF-8: the reason is the size, not the encoding."""
    body = b"\xff" * (40 * 1024 * 1024)
    with pytest.raises(InvalidMessageError) as refused:
        parse(Submission, body)
    assert str(refused.value) == "Submission: " + SIZE_REASON.format(size=41943040, limit=1048576)


def test_a_body_at_the_depth_limit_is_accepted_and_one_level_more_is_refused() -> None:
    assert parse(Submission, _nested(64)).input == {"a": json.loads(b"[" * 62 + b"]" * 62)}
    with pytest.raises(InvalidMessageError) as refused:
        parse(Submission, _nested(65))
    expected = "Submission: JSON nested deeper than the limit of 64 levels (SASFLOW_MAX_JSON_DEPTH)"
    assert str(refused.value) == expected


@pytest.mark.parametrize("model", [Submission, Request, Reply])
def test_100k_deep_json_is_refused_by_the_depth_limit_before_json_loads_recurses(
    model: type[Submission | Request | Reply],
) -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10**6)  # json.loads would not be stopped by a RecursionError now
    try:
        with pytest.raises(InvalidMessageError, match="deeper than the limit of 64 levels"):
            parse(model, body)
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{}", 1),
        (b"3", 0),
        (b'"[[[["', 0),
        (b'{"a":[1,{"b":"]]\\"[[["}],"c":"\\\\"}', 3),
        (b'["\\\\",["x"]]', 2),
        ('{"é":["ü[",["{"]]}'.encode(), 3),
        (b"[[[", 3),  # not JSON: an upper bound of json.loads' recursion
        (b"[" * 70 + b"]" * 70, 65),  # counted as far as the cap + 1
    ],
)
def test_nesting_counts_brackets_outside_strings(body: bytes, expected: int) -> None:
    assert nesting(body, 64) == expected


def test_nesting_agrees_with_json_on_mixed_documents() -> None:
    def depth(value: Any) -> int:
        if isinstance(value, dict):
            return 1 + max(map(depth, value.values()), default=0)
        if isinstance(value, list):
            return 1 + max(map(depth, value), default=0)
        return 0

    document = {"a": [{"b": ["[", "}", {"c": "\\"}]}, []], "d": {"e": {"f": [[["x\\"]]]}}}
    text = json.dumps(document).encode()
    assert nesting(text, 64) == depth(document) == 6


def test_depth_check_of_a_1_mib_body_costs_a_few_milliseconds() -> None:
    """The figure docs/protocol.md quotes (about 5 ms against json.loads' 10 ms); bounded
    loosely here since the machine is shared."""
    record = {"id": 12345, "name": "item", "tags": ["a", "b"], "price": {"amount": 1.5}}
    body = json.dumps({"workflow": "w", "input": {"items": [record] * 13000}}).encode()
    assert len(body) < DEFAULT_LIMITS.max_message_bytes
    started = time.perf_counter()
    assert nesting(body, 64) == 5
    assert time.perf_counter() - started < 0.5


def test_null_and_non_object_run_inputs_are_refused_before_the_store() -> None:
    for text, shown in (("null", "null"), ("[1]", "list"), ('"x"', "str"), ("3", "int")):
        body = b'{"workflow":"w","input":' + text.encode() + b"}"
        with pytest.raises(InvalidMessageError) as refused:
            parse(Submission, body)
        assert str(refused.value) == (
            f"Submission: input: Value error, the run input must be a JSON object, got {shown}"
        )
    assert parse(Submission, b'{"workflow":"w"}').input == {}


def test_limits_are_typed_and_validated() -> None:
    with pytest.raises(ConfigurationError, match="SASFLOW_MAX_MESSAGE_BYTES"):
        Limits(max_message_bytes=10)
    with pytest.raises(ConfigurationError, match="SASFLOW_MAX_JSON_DEPTH"):
        Limits(max_json_depth=10_000)
    small = Limits(max_message_bytes=2048, max_json_depth=3)
    assert parse(Submission, _nested(4), DEFAULT_LIMITS).workflow == "w"
    with pytest.raises(InvalidMessageError, match="limit of 3 levels"):
        parse(Submission, _nested(4), small)


def test_settings_read_the_limits_from_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SASFLOW_MAX_MESSAGE_BYTES", "4096")
    monkeypatch.setenv("SASFLOW_MAX_JSON_DEPTH", "8")
    assert Settings().limits() == Limits(max_message_bytes=4096, max_json_depth=8)


def test_value_depth_counts_python_values_without_recursion() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert value_depth(deep, 64) == 65
    assert value_depth({"a": ({"b": 1},)}, 64) == 3
    assert value_depth("x", 64) == 0


def test_encode_within_refuses_what_a_consumer_would_dead_letter() -> None:
    big = Submission(workflow="w", input={"s": "x" * DEFAULT_LIMITS.max_message_bytes})
    with pytest.raises(InvalidMessageError, match="exceeds the limit of 1048576 bytes"):
        encode_within(big)
    deep: Any = {}
    for _ in range(64):
        deep = {"a": deep}
    with pytest.raises(InvalidMessageError, match="deeper than the limit of 64 levels"):
        encode_within(Submission(workflow="w", input=deep))


def _job() -> Job:
    request = Request(
        step_id=7,
        run_id=3,
        attempt=1,
        workflow="w",
        step="s",
        agent="a",
        action="act",
        idempotency_key="k",
        budget_ms=1000,
        complete_by="2025-01-31T12:00:00+00:00",
    )
    call = Call(
        input=None,
        idempotency_key="k",
        attempt=1,
        deadline=0.0,
        step_id=7,
        run_id=3,
        workflow="w",
        step="s",
        action="act",
        kind="forward",
    )
    return Job(Delivery(tag=1, body=b"", queue="q", generation=1), request, call)


def test_an_agent_sends_an_error_reply_instead_of_an_output_beyond_the_limits() -> None:
    """The scheduler would dead-letter the reply; the agent fails the step with the reason."""
    limits = Limits(max_message_bytes=2048)
    reply = Reply(step_id=7, attempt=1, status="ok", output={"s": "x" * 4096}, agent="a")
    size = len(reply.encode())
    outcome = Outcome.of(_job(), reply, limits)
    assert outcome.reply is not None
    assert outcome.reply.status == "error"
    assert outcome.reply.error is not None
    assert (outcome.reply.error.type, outcome.reply.error.message) == (
        "InvalidOutputError",
        (
            f"the reply could not be sent: message of {size} bytes exceeds the limit of 2048 bytes "
            "(SASFLOW_MAX_MESSAGE_BYTES)"
        ),
    )
    assert parse(Reply, outcome.body, limits).status == "error"


def test_cli_submit_refuses_an_input_beyond_the_limits_or_not_an_object(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b'{"s":"' + b"x" * (2 * 1024 * 1024) + b'"}')
    deep = tmp_path / "deep.json"
    deep.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    runner = CliRunner()
    # Refused before any database work; were it not, the test's own database is used.
    env = {"SASFLOW_APP": "tests.apps.basic", "SASFLOW_DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}
    cases = [
        (f"@{big}", "exceeds the limit of 1048576 bytes (SASFLOW_MAX_MESSAGE_BYTES)"),
        (f"@{deep}", "deeper than the limit of 64 levels (SASFLOW_MAX_JSON_DEPTH)"),
        ("null", "the run input must be a JSON object, got null"),
    ]
    for value, reason in cases:
        result = runner.invoke(cli, ["submit", "pipeline", "--input", value], env=env)
        assert (result.exit_code, reason in " ".join(result.output.split())) == (2, True), (
            result.output
        )
    # The input alone fits, the submission around it does not (64 levels plus the envelope).
    at_edge = runner.invoke(
        cli,
        ["submit", "pipeline", "--input", "{" + '"a":{' * 63 + "}" * 64],
        env=env,
    )
    assert at_edge.exit_code == 2
    assert "deeper than the limit of 64 levels" in " ".join(at_edge.output.split())


def test_cli_resubmit_refuses_an_input_beyond_the_limits_or_not_an_object(tmp_path: Path) -> None:
    cases = {
        b'{"s":"' + b"x" * (2 * 1024 * 1024) + b'"}': "exceeds the limit of 1048576 bytes",
        b"[" * 100_000 + b"]" * 100_000: "deeper than the limit of 64 levels",
        b"null": "the run input must be a JSON object, got NoneType",
    }
    runner = CliRunner()
    for number, (body, reason) in enumerate(cases.items()):
        path = tmp_path / f"input-{number}.json"
        path.write_bytes(body)
        result = runner.invoke(
            cli,
            ["runs", "resubmit", "1", "--reason", "fix", "--input", str(path)],
            env={
                "SASFLOW_APP": "tests.apps.basic",
                "SASFLOW_DATABASE_URL": f"sqlite:///{tmp_path}/t.db",
            },
        )
        assert (result.exit_code, reason in " ".join(result.output.split())) == (2, True), (
            result.output
        )
