"""The scheduler role: claim ready steps, dispatch requests, apply replies, advance runs.

`loop.py` is the role (`Scheduler`); each thing its loop does when due is a duty (`duty.py`):
the cluster membership and the claim (`claims.py`, `cluster/`), the relay of recorded events
(`outbox.py`), the agents' heartbeats (`fleet.py`), the flow plan (`flow.py`). `dispatch.py`
claims and publishes,
`replies.py` applies replies, `inflight.py` and `pools.py` hold steps back at dispatch.
"""

from __future__ import annotations

from sasflow.scheduler.context import SchedulerStats
from sasflow.scheduler.loop import Scheduler
from sasflow.scheduler.options import SchedulerOptions

__all__ = ["Scheduler", "SchedulerOptions", "SchedulerStats"]
