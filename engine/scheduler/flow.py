"""The scheduler's view of flow control (docs/flow-control.md): the flow plan it caches
(store/flow/plan.py), read again every REFRESH_INTERVAL seconds and at once when an operator
changes a limit or the fleet changes (the `limits` notification, or a heartbeat this scheduler
recorded that changes an instance's capacity, actions or breakers), and when an operator pauses
or resumes an agent (the same notification).

The plan says which agents the budgeted claim takes; the claim duty runs it after the plain
claim (engine/scheduler/dispatch.py). The budgeted claim reads the limits again under lock, so
the plan's age delays only a new limit's agent joining it, never a change of a limit's numbers.
"""

from __future__ import annotations

import logging
import threading

from sasflow.scheduler.duty import INF, Duty
from sasflow.store.db import Engine, transaction
from sasflow.store.flow import limits
from sasflow.store.flow.fleet import read_fleet
from sasflow.store.flow.pauses import all_pauses
from sasflow.store.flow.plan import NO_PLAN, FlowPlan, make_plan

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 2.0
"""Seconds between two reads of the limits and the fleet when nothing asked for one sooner."""


class FlowDuty(Duty):
    """Keeps the flow plan; `refresh` asks for a read at the next pass (any thread)."""

    def __init__(
        self,
        engine: Engine,
        wake: threading.Event,
        *,
        fleet_bound: bool = True,
        fleet_factor: float | None = None,
        interval: float = REFRESH_INTERVAL,
    ) -> None:
        self._engine = engine
        self._wake = wake
        self._fleet_bound = fleet_bound
        self._fleet_factor = fleet_factor
        self._interval = interval
        self._asked = threading.Event()
        self.plan: FlowPlan = NO_PLAN
        self.limited = False
        """The last budgeted claim held steps back: an applied reply may free room."""

    def refresh(self) -> None:
        self._asked.set()

    def run(self, t: float) -> float:
        if self._asked.is_set() or t >= self.due:
            self._asked.clear()
            with transaction(self._engine) as conn:
                plan = make_plan(
                    limits.enabled_limits(conn),
                    read_fleet(conn),
                    fleet_bound=self._fleet_bound,
                    fleet_factor=self._fleet_factor,
                    pauses=all_pauses(conn),
                )
            self.due = t + self._interval
            if plan != self.plan:
                log.debug(
                    "flow plan: budgeted agents %s, paused %s",
                    sorted(plan.agents),
                    sorted(plan.paused),
                )
                self.plan = plan
                self._wake.set()  # claim under the new plan now
        return INF
