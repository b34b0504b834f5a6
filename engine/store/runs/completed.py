"""Advancing runs after steps no agent ran changed state (a timer fired: store/runs/timers.py;
an event wait matched or timed out: store/inbound/match.py), in the transaction that changed
them: the runs brought up to date, the step events and the advance's recorded (with their
runs' callbacks), and the schedulers woken when steps became ready."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import Connection, select

from sasflow.commands import FinishedRun
from sasflow.registry import Registry
from sasflow.store.notify import notify_ready
from sasflow.store.runs import events
from sasflow.store.runs.advance import advance_runs
from sasflow.store.schema import runs


class Report(Protocol):
    """What a pass reports of the runs it advanced."""

    ready: int
    deferred: int
    finished: dict[int, FinishedRun]


def advance_completed(
    conn: Connection,
    registry: Registry | None,
    run_ids: set[int],
    recorded: Sequence[events.Event],
    report: Report,
    *,
    namespace: str,
    actor: str,
) -> None:
    """Advance `run_ids`, record `recorded` with the advance's events, and fill `report`."""
    if not run_ids:
        return
    advanced = advance_runs(conn, registry, run_ids, actor=actor)
    callbacks = conn.execute(
        select(runs.c.id).where(runs.c.id.in_(run_ids), runs.c.callback_url.is_not(None))
    ).scalars()
    events.record(conn, [*recorded, *advanced.events], with_callback=set(callbacks))
    report.ready = advanced.ready
    report.deferred = advanced.deferred
    report.finished = events.finished_runs(advanced.events)
    if advanced.ready:
        notify_ready(conn, namespace)
