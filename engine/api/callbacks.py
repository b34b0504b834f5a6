"""Deliver the callbacks outbox: POST each due callback, signed, until a 2xx or the limits.

Runs as a thread of `sasflow api`, never on a request's path. Several API servers share the
work: each claims due rows with SKIP LOCKED and pushes their next attempt a lease ahead
(database clock) before it POSTs outside any transaction, so a callback is attempted by one
server at a time and a server that dies mid-POST only delays it by the lease. A receiver may
still see a callback twice (a crash after its 2xx and before it is recorded): the
`Sasflow-Idempotency-Key` header is its guard.

Headers: `Sasflow-Signature: sha256=HEX`, the HMAC-SHA256 of the exact body bytes under
SASFLOW_API_CALLBACK_SECRET; `Sasflow-Idempotency-Key`; `Sasflow-Attempt` (1, 2, ...).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import threading
from dataclasses import dataclass
from typing import Any

import httpx

from sasflow.errors import SchemaOutdatedError, StoreUnavailableError
from sasflow.schema_watch import SchemaWatch
from sasflow.settings import Settings
from sasflow.store.db import Connection, Engine, run_transaction
from sasflow.store.outbox import callbacks

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Sasflow-Signature"
IDEMPOTENCY_HEADER = "Sasflow-Idempotency-Key"
ATTEMPT_HEADER = "Sasflow-Attempt"
BATCH = 20


def sign(secret: bytes, body: bytes) -> str:
    """The signature header's value for `body`."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str) -> bool:
    """What a receiver checks (constant-time comparison)."""
    return hmac.compare_digest(sign(secret, body), header)


def encode(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class CallbackPolicy:
    """Retry and give-up limits (from the SASFLOW_API_CALLBACK_* settings)."""

    give_up_s: float
    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    timeout_s: float
    poll_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> CallbackPolicy:
        return cls(
            give_up_s=settings.api_callback_give_up_s,
            max_attempts=settings.api_callback_max_attempts,
            backoff_initial_s=settings.api_callback_backoff_initial_s,
            backoff_max_s=settings.api_callback_backoff_max_s,
            timeout_s=settings.api_callback_timeout_s,
            poll_s=settings.api_callback_poll_s,
        )

    def delay(self, attempts: int) -> float:
        """Exponential backoff with jitter (half to all of the doubled delay)."""
        ceiling: float = min(
            self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(attempts - 1, 40)
        )
        return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret

    @property
    def lease_s(self) -> float:
        """How long a claimed callback is left to this server before another may take it."""
        return self.timeout_s + 30


class CallbackSender:
    """The delivery loop; `run()` returns when `stop` is set."""

    def __init__(
        self,
        engine: Engine,
        secret: bytes,
        policy: CallbackPolicy,
        *,
        stop: threading.Event,
        client: httpx.Client | None = None,
        schema: SchemaWatch | None = None,
    ) -> None:
        self._engine = engine
        self._schema = schema or SchemaWatch(engine, "callbacks")
        self._secret = secret
        self._policy = policy
        self._stop = stop
        self._client = client or httpx.Client(timeout=policy.timeout_s, follow_redirects=False)
        self.delivered = 0
        self.failed = 0

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    busy = self.deliver_due()
                    self._schema.ok()
                except SchemaOutdatedError as exc:
                    self._schema.failed(exc)  # said once; polled again quietly
                    busy = False
                except StoreUnavailableError as exc:
                    log.warning("callbacks: database unavailable: %s", exc)
                    busy = False
                if not busy:
                    self._stop.wait(self._policy.poll_s)
        finally:
            self._client.close()

    def deliver_due(self) -> bool:
        """Deliver one batch of due callbacks; True when the batch was full."""
        policy = self._policy

        def claim(conn: Connection) -> list[Any]:
            return list(
                callbacks.claim_due(
                    conn, limit=BATCH, lease_s=policy.lease_s, give_up_s=policy.give_up_s
                )
            )

        due = run_transaction(self._engine, claim)
        for row in due:
            if self._stop.is_set():
                break  # the lease hands the rest to another server (or to our restart)
            self._deliver(row)
        return len(due) == BATCH

    def _deliver(self, row: Any) -> None:
        body = encode(row.payload)
        error = self._post(row, body)
        if error is None:
            self.delivered += 1
            run_transaction(self._engine, lambda conn: callbacks.mark_delivered(conn, row.id))
            return
        if row.attempts >= self._policy.max_attempts or row.expired:
            self.failed += 1
            log.error("callback %s of run %s given up: %s", row.id, row.run_id, error)
            run_transaction(
                self._engine,
                lambda conn: callbacks.give_up(conn, row.id, row.run_id, url=row.url, error=error),
            )
            return
        delay = self._policy.delay(row.attempts)
        log.info("callback %s to %s failed (%s): retry in %.1f s", row.id, row.url, error, delay)
        run_transaction(
            self._engine,
            lambda conn: callbacks.retry_later(conn, row.id, delay_s=delay, error=error),
        )

    def _post(self, row: Any, body: bytes) -> str | None:
        """POST the callback; None on a 2xx, else what went wrong."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "sasflow-callbacks",
            SIGNATURE_HEADER: sign(self._secret, body),
            IDEMPOTENCY_HEADER: row.idempotency_key,
            ATTEMPT_HEADER: str(row.attempts),
        }
        try:
            response = self._client.post(row.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:1000]
        if response.is_success:
            return None
        return f"HTTP {response.status_code}"
