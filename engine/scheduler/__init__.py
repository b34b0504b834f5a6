"""The scheduler role: claim ready steps, dispatch requests, apply replies, advance runs."""

from __future__ import annotations

from sasflow.scheduler.loop import Scheduler, SchedulerOptions, SchedulerStats

__all__ = ["Scheduler", "SchedulerOptions", "SchedulerStats"]
