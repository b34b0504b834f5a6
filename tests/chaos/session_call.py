"""The limited action's handler (`charge`, at most one at a time per account), observed from
the agent side: it opens a session at the fake remote service when it starts, does its work,
and closes the session with its effect call (tests/chaos/sessions.py).

Past its deadline an agent stays silent (docs/protocol.md 5.2): the handler checks
`call.remaining()` before its effect and gives up by raising a TransientError, which the agent
does not retry past the deadline and answers with no reply (an agent stopping hands the step
back instead), and gives its session back. The service refuses (409) an
effect whose session's lease ended (an agent frozen between that check and the call): the
handler gives up the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from typing import Any
from urllib.parse import urljoin

from sasflow.agents import Call, TransientError

REMOTE_URL = "SASFLOW_CHAOS_REMOTE_URL"


class GaveUpError(TransientError):
    """Past the deadline, or the service refused: no effect, no reply."""


def _post(url: str, body: dict[str, Any], call: Call) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 - loopback
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=max(0.1, min(3.0, call.remaining()))
        ) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as exc:
        if exc.code == 409:  # the service refuses: the lease ended
            why = exc.read().decode(errors="replace")
            raise GaveUpError(f"the service refused: {why}") from exc
        raise TransientError(f"remote service answered {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise TransientError(f"remote service unreachable: {exc}") from exc


def charge_in_session(call: Call) -> dict[str, Any]:
    """Open a session for the run's account, work, apply the effect through the session."""
    url = os.environ.get(REMOTE_URL)
    if not url:
        raise TransientError(f"{REMOTE_URL} is not set")
    values = call.input or {}
    budget = call.remaining()
    if budget <= 0 or call.cancelled.is_set():
        raise GaveUpError("past the deadline before the session")
    pid = os.getpid()
    session = f"{pid}-{call.step_id}-{call.attempt}-{uuid.uuid4().hex[:12]}"
    common = {"step_id": call.step_id, "attempt": call.attempt, "pid": pid, "session": session}
    _post(
        urljoin(url, "session/open"),
        {**common, "account": str(values.get("account", "")), "budget": budget},
        call,
    )
    time.sleep(float(values.get("work", 0)))
    if call.remaining() <= 0 or call.cancelled.is_set():
        # Give the session back: an agent stopping hands the step back (`deferred`), and
        # another may take it at once. Past the lease this changes nothing.
        with contextlib.suppress(TransientError):
            _post(urljoin(url, "session/release"), common, call)
        raise GaveUpError("past the deadline (or stopping) before the effect")
    effect = _post(
        urljoin(url, "session/close"),
        {**common, "key": call.idempotency_key, "run_id": call.run_id, "step": call.step},
        call,
    )
    return {
        "effect": effect["effect"],
        "attempt": call.attempt,
        "key": call.idempotency_key,
        "step": call.step,
    }
