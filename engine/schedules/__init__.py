"""Recurring schedules as the app declares them: `Schedule` and its tick timing and catch-up
(croniter). The scheduler cluster fires them (`sasflow.scheduler.cluster.firing`) and syncs the
app's declarations into the store (`sasflow.scheduler.cluster.sync`); docs/schedules.md."""
