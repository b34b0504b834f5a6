"""Callback signatures and backoff: what a receiver verifies, and how retries spread out."""

from __future__ import annotations

import hashlib
import hmac

import pydantic
import pytest

from sasflow.api.callbacks import CallbackPolicy, encode, sign, verify
from sasflow.settings import Settings

POLICY = CallbackPolicy(
    give_up_s=86400,
    max_attempts=1024,
    backoff_initial_s=1.0,
    backoff_max_s=600.0,
    timeout_s=10,
    poll_s=1,
)


def test_the_signature_is_hmac_sha256_of_the_exact_body() -> None:
    body = encode({"idempotency_key": "k", "run": {"id": 1, "state": "completed"}})
    expected = "sha256=" + hmac.new(b"key", body, hashlib.sha256).hexdigest()
    assert sign(b"key", body) == expected
    assert verify(b"key", body, expected)
    assert not verify(b"other", body, expected)
    assert not verify(b"key", body + b" ", expected)


def test_backoff_doubles_with_jitter_up_to_the_maximum() -> None:
    for attempts, ceiling in [(1, 1.0), (2, 2.0), (5, 16.0), (10, 512.0), (11, 600.0)]:
        delays = [POLICY.delay(attempts) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempts, delays)
    assert POLICY.delay(1024) <= 600.0


def test_a_short_callback_key_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="at least 16 characters"):
        Settings(api_callback_secret="short")  # noqa: S106 - a refused key, not a secret
    assert Settings(api_callback_secret="x" * 16).api_callback_secret is not None
