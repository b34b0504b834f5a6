"""Cancels of running steps, sent by the relay on the control exchange (docs/protocol.md):
which attempt a cancel stops here, and the attempts cancelled lately, so a request of one that
arrives after its cancel (it waited in the queue) is never run.

Fenced: a cancel acts only on a job running exactly its (step id, attempt); a stale one (an
earlier attempt) or one for another instance's attempt changes nothing here. Acting means:
`call.cancelled` is set (retries stop, handlers that poll it return), `call.aborted` too (the
programs of `Call.run` get SIGTERM, then SIGKILL after their grace; an `async def` handler's
task is cancelled), and the job is `revoked`: whatever its handler returns, no reply is sent
(the database ended the attempt `cancelled` when the cancel was made; a reply would be fenced
out anyway) and its request is acknowledged.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping

from sasflow.agents.jobs import Job
from sasflow.messages import Cancel

log = logging.getLogger(__name__)

REMEMBERED = 10_000
"""Cancelled attempts an agent process remembers (the oldest forgotten first)."""

JobKey = tuple[int, int]


class Cancels:
    """The cancels one agent process received (owner thread only)."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._remembered = remembered
        self._seen: OrderedDict[JobKey, None] = OrderedDict()

    def received(self, cancel: Cancel, jobs: Mapping[JobKey, Job]) -> Job | None:
        """Stop the job running `cancel`'s attempt, if one runs here; returns it (None: no such
        attempt runs here, or it was stopped already)."""
        key = (cancel.step_id, cancel.attempt)
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        job = jobs.get(key)
        if job is None or job.abandoned or job.revoked:
            return None
        job.revoked = True
        job.call.cancelled.set()
        job.call.aborted.set()
        log.warning(
            "step %s attempt %s cancelled while it ran here (%s): handler told, programs stopped",
            cancel.step_id,
            cancel.attempt,
            cancel.reason or "no reason given",
        )
        return job

    def cancelled(self, step_id: int, attempt: int) -> bool:
        """Whether that attempt was cancelled (a request of it is not to be run)."""
        return (step_id, attempt) in self._seen
