"""Inputs that once crashed or stalled a process (found in review) are now plain errors."""

from __future__ import annotations

import threading
import time

import pytest

from sasflow.agents.errors import BreakerOpenError
from sasflow.agents.resilience import SharedBreaker
from sasflow.errors import InvalidMessageError
from sasflow.messages import Reply, Submission, dumps, parse, safe_text
from sasflow.policy import BreakerPolicy
from sasflow.runtime import process_id


def test_deeply_nested_json_is_an_invalid_message_not_a_recursion_error() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(InvalidMessageError, match=r"nested deeper than the limit of 64"):
        parse(Reply, body)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("a\x00b", "NUL character"),
        ({"k\x00": 1}, "NUL character"),
        ([1, ["\x00"]], "NUL character"),
        ({"name": "\ud800"}, "not UTF-8"),
    ],
)
def test_dumps_rejects_values_the_store_or_broker_cannot_hold(value: object, reason: str) -> None:
    with pytest.raises(InvalidMessageError, match=reason):
        dumps(value)


def test_dumps_keeps_a_literal_backslash_u0000_text() -> None:
    assert dumps("see \\u0000") == '"see \\\\u0000"'


def test_safe_text_removes_nul_and_lone_surrogates_and_bounds_length() -> None:
    assert safe_text("x\x00y\ud800z") == "x\\0y\\ud800z"
    assert len(safe_text("e" * 10_000)) == 4000


def test_reply_to_is_bounded_in_utf8_bytes_like_an_amqp_short_string() -> None:
    assert Submission(workflow="w", reply_to="a" * 255).reply_to == "a" * 255
    with pytest.raises(ValueError, match="255 bytes"):
        Submission(workflow="w", reply_to="é" * 200)


def test_process_id_fits_the_100_character_columns_whatever_the_hostname(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "h" * 250)
    assert len(process_id("scheduler")) <= 100


def test_a_hung_half_open_trial_does_not_lock_the_breaker_forever() -> None:
    """After reset_timeout without an outcome, the trial is presumed hung and a new one runs."""
    breaker = SharedBreaker("api", BreakerPolicy(fail_max=1, reset_timeout=0.1))
    with pytest.raises(ConnectionError):
        breaker.call(_refuse, _always)
    time.sleep(0.12)
    assert breaker.acquire() is True  # the trial, which never reports back
    with pytest.raises(BreakerOpenError):
        breaker.acquire()
    time.sleep(0.12)
    assert breaker.acquire() is True
    breaker.record(trial=True, failure=None)
    assert breaker.state == "closed"
    done = threading.Event()
    breaker.call(done.set, _always)
    assert done.is_set()


def _always(_exc: BaseException) -> bool:
    return True


def _refuse() -> None:
    raise ConnectionError("down")
