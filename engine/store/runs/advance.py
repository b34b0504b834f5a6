"""Advance runs after their steps changed: read each run and its steps, ask `store.decide` what
follows (successors made ready, the run finished, or its failure policy applied: error and an
alert, or compensation) and apply those transitions, with their events, in the caller's
transaction.

Callers hold the runs' row locks (see queries.lock_runs_of_steps), so two schedulers applying
the last two replies of a fan-in cannot both miss that the join step became ready.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row

from sasflow.commands import StoredError
from sasflow.errors import SasflowError
from sasflow.registry import Registry
from sasflow.states import ACTIVE_RUN_STATES, RunState, StepKind, StepState
from sasflow.store.inbound.consume import consume_at_open
from sasflow.store.outbox.alerts import raise_alert
from sasflow.store.runs import advance_queries, children, queries
from sasflow.store.runs.decide import (
    NOTHING_BUILT,
    Built,
    CreateChain,
    Definition,
    FailWaiting,
    Finish,
    MakeReady,
    NeedsAdvance,
    NotLoaded,
    OpenWait,
    RaiseAlert,
    Release,
    Skip,
    StartCompensation,
    StartTimer,
    Transition,
    decide,
)
from sasflow.store.runs.events import Event, step_event
from sasflow.store.runs.map_drain import drain_items
from sasflow.store.runs.mapping import EndMap, ExpandMap
from sasflow.store.runs.parked import resolve_parked_alert
from sasflow.store.runs.records import RunRecord, StepRecord

log = logging.getLogger(__name__)


@dataclass
class Advance:
    """What advancing did: events to record, steps made ready, alerts raised."""

    events: list[Event] = field(default_factory=list)
    ready: int = 0
    alerts: list[int] = field(default_factory=list)
    compensations: int = 0
    deferred: int = 0
    """Runs marked for the schedulers' advance duty (user code to run, or a version to find)."""


def advance_runs(
    conn: Connection,
    registry: Registry | None,
    run_ids: Iterable[int],
    *,
    actor: str,
    locked: Iterable[Row[Any]] | None = None,
    built: Mapping[int, Built] | None = None,
    map_items: Mapping[int, frozenset[int]] | None = None,
) -> Advance:
    """Bring each of `run_ids` up to date with its steps' states.

    `locked`: rows of queries.lock_runs_of_steps that the caller read in this transaction, under
    the runs' locks (a superset of `run_ids` is fine); without them the runs are locked and
    read here. Without a registry (the supervisor, operators) no step input can be built: only
    failures and compensation are handled, which need nothing but the stored rows; what needs
    the definition is marked for a scheduler's advance duty, as is what needs user code.
    `built`: run id -> what that duty built for it off the loop. `map_items`: run id -> the
    maps whose items ended, for the runs where nothing else changed: while those maps go on,
    their next items are released without reading the run (store.runs.map_drain).
    """
    ids = sorted(set(run_ids))
    applier = _Applier(conn, actor, registry)
    if not ids:
        return applier.result
    if locked is None:
        locked = conn.execute(queries.runs_by_id(), {"b_run_ids": ids})
    wanted = set(ids)
    run_records = {r.id: RunRecord.from_row(r._mapping) for r in locked if r.id in wanted}
    for run_id, parents in (map_items or {}).items():
        if run_id not in wanted:
            continue
        drained = drain_items(conn, run_records[run_id], parents, actor=actor)
        if drained is not None:
            applier.result.events += drained
            applier.result.ready += len(drained)
            ids.remove(run_id)
    if not ids:
        return applier.result
    by_run: dict[int, list[StepRecord]] = defaultdict(list)
    for row in conn.execute(queries.steps_of_runs(), {"b_run_ids": ids}):
        by_run[row.run_id].append(StepRecord.from_row(row._mapping))
    for run_id in ids:
        run, steps = run_records[run_id], by_run[run_id]
        workflow = _definition(registry, run, actor) if run.state in ACTIVE_RUN_STATES else None
        made = built.get(run_id, NOTHING_BUILT) if built else NOTHING_BUILT
        transitions = decide(run, steps, workflow, made)
        while transitions:
            run, steps = applier.apply(run, steps, transitions)
            maps = applier.take_maps()
            # A chain whose first record undoes a child step: its child's compensation starts.
            chained = applier.take_child_chain()
            # An opened wait that took its event at once is processed, as is an empty map: their
            # successors follow.
            if (
                not isinstance(transitions[-1], StartCompensation)
                and not applier.take_matched()
                and not chained
            ):
                break
            if maps or chained:  # items created, a map ended or a chain created: the rows say how
                steps = [
                    StepRecord.from_row(row._mapping)
                    for row in conn.execute(queries.steps_of_runs(), {"b_run_ids": [run_id]})
                ]
            if not chained:
                # Compensating now, or a wait matched: decide again from the forward steps as
                # the transitions left them.
                steps = [s for s in steps if s.kind == StepKind.FORWARD]
            transitions = decide(run, steps, workflow, made)
    return applier.result


def _definition(registry: Registry | None, run: RunRecord, actor: str) -> Definition:
    if registry is None:
        return None
    try:
        return registry.workflow(run.workflow, run.version)
    except SasflowError:
        return NotLoaded(actor)


class _Applier:
    """Applies decisions with `advance_queries`, recording their events and counts."""

    def __init__(self, conn: Connection, actor: str, registry: Registry | None) -> None:
        self.conn = conn
        self.actor = actor
        self.registry = registry
        self.result = Advance()
        self._child_chain = False
        self._failed: dict[int, Any] = {}
        """Child steps that failed as they were applied, this apply: step id -> its error."""
        """A compensation chain whose first record undoes a child step, this apply."""
        self._matched: dict[int, Any] = {}
        """Waits that took their event as they opened, this apply: step id -> its output."""
        self._any_matched = False
        self._maps = False
        """A map's items were created or a map ended, this apply."""

    def take_maps(self) -> bool:
        """Whether a map's items were created or a map ended since the last call."""
        found, self._maps = self._maps, False
        return found

    def take_child_chain(self) -> bool:
        """Whether a chain whose first record undoes a child step was created since the last
        call."""
        found, self._child_chain = self._child_chain, False
        return found

    def take_matched(self) -> bool:
        """Whether a wait took its event as it opened since the last call."""
        found, self._any_matched = self._any_matched, False
        return found

    def apply(  # noqa: PLR0912 - one branch per transition
        self, run: RunRecord, steps: Sequence[StepRecord], transitions: Sequence[Transition]
    ) -> tuple[RunRecord, list[StepRecord]]:
        """Apply `transitions` to `run`; returns the run and its steps as they are now."""
        moved: dict[int, StepState] = {}
        for transition in transitions:
            match transition:
                case MakeReady() | StartTimer() | OpenWait():
                    self._make_ready(transition)
                    moved[transition.step.id] = (
                        StepState.PROCESSED
                        if transition.step.id in self._matched
                        else StepState.PENDING
                    )
                case FailWaiting(step, error):
                    self.conn.execute(
                        advance_queries.fail_waiting(),
                        {"b_id": step.id, "b_error": error.to_json()},
                    )
                    moved[step.id] = StepState.ERROR
                    self._step_event(step, StepState.WAITING, StepState.ERROR, error.message)
                case Skip(step, from_state, reason, detail):
                    moved[step.id] = self._skip(step, from_state, reason, detail)
                case Release(step, reason):
                    self.conn.execute(advance_queries.release_waiting(), {"b_id": step.id})
                    moved[step.id] = StepState.PENDING
                    self.result.ready += 1
                    self._step_event(step, StepState.WAITING, StepState.PENDING, reason)
                case ExpandMap() | EndMap():
                    moved[transition.step.id] = self._map(transition)
                case children.StartChild():
                    moved[transition.step.id] = self._start_child(run, transition)
                case children.CompensateChild():
                    self._compensate_child(transition)
                case StartCompensation(error):
                    stored = error.to_json()
                    self.conn.execute(
                        advance_queries.set_run_state(),
                        {"b_id": run.id, "b_state": RunState.COMPENSATING, "b_error": stored},
                    )
                    self._run_event(
                        run, RunState.COMPENSATING, {"error": stored}, reason="step failed"
                    )
                    self.result.compensations += 1
                    run = dataclasses.replace(run, state=RunState.COMPENSATING, error=error)
                case CreateChain(records):
                    self._create_chain(run, records)
                case Finish(to_state, output, error):
                    stored = error.to_json() if error is not None else None
                    self.conn.execute(
                        advance_queries.finish_run(),
                        {
                            "b_id": run.id,
                            "b_state": to_state,
                            "b_output": output,
                            "b_error": stored,
                        },
                    )
                    detail = (
                        {"output": output} if to_state == RunState.COMPLETED else {"error": stored}
                    )
                    self._run_event(run, to_state, detail)
                    self._child_ended(run, to_state, output, stored)
                    run = dataclasses.replace(run, state=to_state, error=error)
                case NeedsAdvance(reason, to_build, output):
                    self.conn.execute(advance_queries.mark_advance(), {"b_id": run.id})
                    self.result.deferred += 1
                    # A hand-over (no definition here) is said; user code to run is routine.
                    handover = not to_build and not output
                    log.log(
                        logging.INFO if handover else logging.DEBUG,
                        "%s: run %s left to a scheduler's advance duty: %s",
                        self.actor,
                        run.id,
                        reason,
                    )
                case RaiseAlert(alert):
                    alert_id = raise_alert(self.conn, alert)
                    if alert_id is not None:
                        self.result.alerts.append(alert_id)
        return run, self._current(steps, moved)

    def _current(
        self, steps: Sequence[StepRecord], moved: Mapping[int, StepState]
    ) -> list[StepRecord]:
        """`steps` as the transitions left them: their states, the outputs of the waits that
        took their event as they opened, and the errors of child steps that could not
        start."""
        matched, self._matched = self._matched, {}
        failed, self._failed = self._failed, {}
        current = []
        for s in steps:
            if s.id in moved:
                s = dataclasses.replace(s, state=moved[s.id])  # noqa: PLW2901 - the step, moved
            if s.id in matched:
                s = dataclasses.replace(s, output=matched[s.id])  # noqa: PLW2901
            if s.id in failed:
                s = dataclasses.replace(s, error=failed[s.id])  # noqa: PLW2901
            current.append(s)
        return current

    def _make_ready(self, ready: MakeReady | StartTimer | OpenWait) -> None:
        if isinstance(ready, OpenWait):
            self.conn.execute(
                advance_queries.open_wait(),
                {
                    "b_id": ready.step.id,
                    "b_input": ready.input,
                    "b_correlation": ready.correlation,
                    "b_seconds": ready.seconds,
                },
            )
            self.result.ready += 1  # wakes the schedulers
            if "approval" in ready.input:  # decided by a person, no stored event takes it
                if ready.escalate_after is not None:
                    self.conn.execute(
                        advance_queries.escalate_at(),
                        {"b_id": ready.step.id, "b_seconds": ready.escalate_after},
                    )
                self._step_event(ready.step, StepState.WAITING, StepState.PENDING, "approval")
                return
            self._step_event(ready.step, StepState.WAITING, StepState.PENDING, "event wait")
            event = ready.input["event"]
            taken = consume_at_open(self.conn, ready.step.id, event, ready.correlation)
            if taken is not None:
                self._matched[ready.step.id] = taken.payload
                self._any_matched = True
                self.result.events.append(
                    step_event(
                        ready.step,
                        StepState.PENDING,
                        StepState.PROCESSED,
                        actor=self.actor,
                        reason="event",
                        detail={
                            "event": event,
                            "event_id": taken.event_id,
                            "correlation": ready.correlation,
                        },
                    )
                )
            return
        if isinstance(ready, MakeReady):
            self.conn.execute(
                advance_queries.make_ready(), {"b_id": ready.step.id, "b_input": ready.input}
            )
            self.result.ready += 1
            self._step_event(ready.step, StepState.WAITING, StepState.PENDING)
            return
        timer = ready
        if timer.until is None:
            self.conn.execute(
                advance_queries.start_timer(),
                {"b_id": timer.step.id, "b_input": timer.input, "b_seconds": timer.seconds},
            )
        else:
            self.conn.execute(
                advance_queries.start_timer_until(),
                {
                    "b_id": timer.step.id,
                    "b_input": timer.input,
                    "b_until": datetime.fromisoformat(timer.until),
                },
            )
        self.result.ready += 1
        self._step_event(timer.step, StepState.WAITING, StepState.PENDING, "timer")

    def _start_child(self, run: RunRecord, start: children.StartChild) -> StepState:
        """A ready child step submits its child (it stays waiting), or fails; its state now."""
        made = children.start(self.conn, self.registry, run, start)
        if isinstance(made, children.Existing):
            self.conn.execute(
                advance_queries.end_map(),
                {
                    "b_id": start.step.id,
                    "b_state": StepState.PROCESSED,
                    "b_output": made.output,
                    "b_error": None,
                },
            )
            detail = {"child_run_id": made.run_id, "workflow": start.new.workflow}
            self._step_event(start.step, StepState.WAITING, StepState.PROCESSED, "child", detail)
            self._any_matched = True  # decided again: its successors follow
            return StepState.PROCESSED
        if isinstance(made, StoredError):
            self.conn.execute(
                advance_queries.fail_waiting(), {"b_id": start.step.id, "b_error": made.to_json()}
            )
            self._step_event(start.step, StepState.WAITING, StepState.ERROR, made.message)
            self._failed[start.step.id] = made.to_json()
            self._any_matched = True  # decided again: the run's failure policy follows
            return StepState.ERROR
        self.result.ready += 1  # the child's first steps
        detail = {"child_run_id": made, "workflow": start.new.workflow}
        self._step_event(start.step, StepState.WAITING, StepState.WAITING, "child", detail)
        return StepState.WAITING

    def _compensate_child(self, undo: children.CompensateChild) -> None:
        """A compensation record of a child step: its child run compensates, advanced here
        (its chain created, or compensated at once, which ends the record)."""
        self.result.events += children.compensate(self.conn, undo, actor=self.actor)
        self._merge(advance_runs(self.conn, None, [undo.run_id], actor=self.actor))

    def _child_ended(self, run: RunRecord, state: RunState, output: Any, error: Any) -> None:
        """A run ended: when a step of its parent waited for it, that step ends and the
        parent is advanced, in this transaction. A run that is no child (its row, read with
        the run) costs nothing more."""
        if run.parent_run_id is None:
            return
        parent, ended = children.ended(
            self.conn, run.id, run.workflow, state, output, error, actor=self.actor
        )
        self.result.events += ended
        if parent is not None:
            self._merge(advance_runs(self.conn, self.registry, [parent], actor=self.actor))

    def _merge(self, nested: Advance) -> None:
        """What advancing another run (a parent, a child) did, counted with this one."""
        self.result.events += nested.events
        self.result.ready += nested.ready
        self.result.alerts += nested.alerts
        self.result.compensations += nested.compensations
        self.result.deferred += nested.deferred

    def _map(self, transition: ExpandMap | EndMap) -> StepState:
        """A map's items created, or the map ended; its state now."""
        self._maps = True
        if isinstance(transition, EndMap):
            return self._end_map(transition)
        self._expand_map(transition)
        return StepState.WAITING

    def _expand_map(self, expand: ExpandMap) -> None:
        """A map's items, inserted, its own record waiting with what it runs over; one event
        for the map (each item's own events follow as it is claimed)."""
        self.conn.execute(
            advance_queries.expand_map(), {"b_id": expand.step.id, "b_input": expand.input}
        )
        self.conn.execute(advance_queries.insert_items(), list(expand.items))
        self.result.ready += 1
        self.result.events.append(
            step_event(
                expand.step,
                StepState.WAITING,
                StepState.WAITING,
                actor=self.actor,
                reason="map",
                detail=expand.input["map"],
            )
        )

    def _end_map(self, end: EndMap) -> StepState:
        """A waiting map ends processed with its output, or in error; its state now."""
        error = end.error.to_json() if end.error is not None else None
        ended = self.conn.execute(
            advance_queries.end_map(),
            {"b_id": end.step.id, "b_state": end.state, "b_output": end.output, "b_error": error},
        ).rowcount
        if ended != 1:
            return end.step.state
        if end.at_once:
            self._any_matched = True
        self.result.events.append(
            step_event(
                end.step,
                StepState.WAITING,
                end.state,
                actor=self.actor,
                reason="map",
                detail={"error": error} if error is not None else None,
            )
        )
        return end.state

    def _create_chain(self, run: RunRecord, records: Sequence[dict[str, Any]]) -> None:
        self._child_chain = records[0]["state"] == StepState.WAITING
        inserted = self.conn.execute(advance_queries.insert_steps(), list(records)).all()
        for record, row in zip(records, inserted, strict=True):
            self.result.events.append(
                Event(
                    run_id=run.id,
                    entity="step",
                    step_id=row.id,
                    step=record["name"],
                    from_state=None,
                    to_state=record["state"],
                    actor=self.actor,
                    reason="compensation",
                    detail={"kind": StepKind.COMPENSATION, "action": record["action"]},
                )
            )
        self.result.ready += 1  # the chain's first step

    def _skip(
        self, step: StepRecord, from_state: StepState, reason: str, detail: Any = None
    ) -> StepState:
        """Skip a step not started; its state now (processing: claimed meanwhile, in flight).
        A parked step's alert is closed: nobody need unpark or fail it now."""
        if self.conn.execute(advance_queries.skip(), {"b_id": step.id}).rowcount != 1:
            return StepState.PROCESSING
        self.result.events.append(
            step_event(
                step, from_state, StepState.SKIPPED, actor=self.actor, reason=reason, detail=detail
            )
        )
        if from_state == StepState.PARKED:
            resolve_parked_alert(self.conn, step.id, actor=self.actor, reason=reason)
        return StepState.SKIPPED

    def _step_event(
        self,
        step: StepRecord,
        from_state: StepState,
        to_state: StepState,
        reason: str | None = None,
        detail: Any = None,
    ) -> None:
        self.result.events.append(
            step_event(step, from_state, to_state, actor=self.actor, reason=reason, detail=detail)
        )

    def _run_event(
        self, run: RunRecord, to_state: RunState, detail: Any, reason: str | None = None
    ) -> None:
        self.result.events.append(
            Event(
                run_id=run.id,
                entity="run",
                from_state=run.state,
                to_state=to_state,
                actor=self.actor,
                detail=detail,
                reason=reason,
                workflow=run.workflow,
            )
        )
