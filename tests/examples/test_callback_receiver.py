"""The callback receiver of docs/howto/callback-receiver.md: signed callbacks are handled once
per idempotency key, forged ones refused."""

from __future__ import annotations

from typing import Any

import httpx

from examples.callback_receiver import Receiver
from sasflow.api.callbacks import encode, sign
from tests.integration.webhook import serving


def test_receiver_handles_each_key_once_and_refuses_a_bad_signature() -> None:
    handled: list[Any] = []
    body = encode({"idempotency_key": "k1", "run": {"id": 1, "state": "completed"}})
    with serving(Receiver(0, b"key", handled.append)) as receiver:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/sasflow"

        def post(signature: str, key: str = "k1") -> int:
            headers = {"Sasflow-Signature": signature, "Sasflow-Idempotency-Key": key}
            return httpx.post(url, content=body, headers=headers).status_code

        assert post(sign(b"key", body)) == 200
        assert post(sign(b"key", body)) == 200  # a repeat: acknowledged, not handled again
        assert post(sign(b"wrong", body)) == 401
        assert post("sha256=00") == 401
    assert handled == [{"idempotency_key": "k1", "run": {"id": 1, "state": "completed"}}]
