"""Migrating runs in flight from one version of a workflow to another (`sasflow runs migrate`,
docs/operations.md "Migrating runs in flight").

Eligible: the runs of the workflow at `from_version` that are `pending` or `running`. A run
that ended (completed, error, cancelled, compensated...) or is compensating is left as it is:
an error run can be resubmitted first, then migrated.

Each old step is matched to a step of the new version by name, or by `renames` (`--map
old=new`):

- a matched step keeps its record: its state, attempt, idempotency key, input and output. One
  that has not started (waiting, or pending and never dispatched) takes the new definition
  whole (agent, action, policy, dependencies) and waits: advancing the run makes it pending
  with its input once its new dependencies are processed. One that started (processing,
  processed, or pending again after an attempt) keeps what it ran with; only its dependencies
  follow the new graph.
- an old step with no match: deleted if it never started; kept as history if it is done
  (processed or skipped: its output stays, and a later compensation still undoes it); and if
  it is in flight or its outcome is unknown (processing, or pending after an attempt), the
  run is refused with that reason: such a step is never dropped.
- a new step with no match is added, waiting, with a fresh idempotency key.

Then the run's version (and failure policy) becomes the new one's and the run is advanced by
the code that advances every run (store.runs.advance), which makes ready what can start,
or completes the run when nothing is left. One transaction per run, with an event on the run
carrying the actor, the reason and the diff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sasflow.errors import InvalidActionError, InvalidInputError, SasflowError
from sasflow.ops.actions import lock_run
from sasflow.ops.reasons import REASON_MAX, has_text
from sasflow.registry import Registry
from sasflow.states import ACTIVE_RUN_STATES, DONE_STEP_STATES, StepState
from sasflow.store.db import Connection, Engine, run_transaction
from sasflow.store.notify import notify_ready
from sasflow.store.operator import migration as store
from sasflow.store.operator import transitions as operator
from sasflow.store.runs import events
from sasflow.store.runs.advance import advance_runs
from sasflow.workflow import Workflow


@dataclass(frozen=True)
class Migration:
    """What to migrate: the runs of `workflow` from one version to another, `renames` mapping
    an old step's name to its new name."""

    workflow: str
    from_version: int
    to_version: int
    renames: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OldStep:
    """What the plan reads of a step record."""

    id: int
    name: str
    state: str
    attempt: int

    @property
    def started(self) -> bool:
        """Dispatched at least once, or past waiting and pending."""
        return self.attempt > 0 or self.state not in (StepState.WAITING, StepState.PENDING)


@dataclass(frozen=True)
class RunPlan:
    """One run's diff: old names of the steps kept (old -> new), added, removed (never
    started), kept as history (done, not in the new version); or why it is refused."""

    run_id: int
    kept: dict[str, str]
    added: list[str]
    removed: list[str]
    history: list[str]
    refused: str | None = None

    def diff(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "renamed": {old: new for old, new in self.kept.items() if old != new},
            "kept": sorted(self.kept.values()),
            "removed": self.removed,
            "history": self.history,
        }


@dataclass(frozen=True)
class RunMigration:
    """The outcome for one run: migrated (or, in a dry run, would be), or refused."""

    run_id: int
    plan: RunPlan
    migrated: bool
    state: str

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "migrated": self.migrated,
            "refused": self.plan.refused,
            "state": self.state,
            **self.plan.diff(),
        }


def definitions(registry: Registry, spec: Migration) -> tuple[Workflow, Workflow]:
    """Both versions as the registry has them, the renames checked against them:
    InvalidInputError saying what is wrong."""
    if spec.from_version == spec.to_version:
        raise InvalidInputError("--from-version and --to-version are the same version")
    old = registry.workflow(spec.workflow, spec.from_version)
    new = registry.workflow(spec.workflow, spec.to_version)
    for before, after in spec.renames.items():
        if before not in old.order:
            raise InvalidInputError(
                f"--map {before}={after}: version {old.version} of {old.name} has no step "
                f"{before!r} (its steps: {', '.join(old.order)})"
            )
        if after not in new.order:
            raise InvalidInputError(
                f"--map {before}={after}: version {new.version} of {new.name} has no step "
                f"{after!r} (its steps: {', '.join(new.order)})"
            )
    targets: dict[str, str] = {}
    for name in old.order:
        target = _target(name, new, spec.renames)
        if target is not None and target in targets:
            raise InvalidInputError(
                f"steps {targets[target]!r} and {name!r} of version {old.version} would both "
                f"become {target!r}: --map one of them to another step"
            )
        if target is not None:
            targets[target] = name
    return old, new


def _target(name: str, new: Workflow, renames: Mapping[str, str]) -> str | None:
    target = renames.get(name, name)
    return target if target in new.order else None


def plan(
    run_id: int, steps: Sequence[OldStep], new: Workflow, renames: Mapping[str, str]
) -> RunPlan:
    """The diff of one run's steps against `new` (no I/O; see the module docstring)."""
    kept: dict[str, str] = {}
    removed: list[str] = []
    history: list[str] = []
    in_flight: list[OldStep] = []
    for step in steps:
        target = _target(step.name, new, renames)
        if target is not None:
            kept[step.name] = target
        elif not step.started:
            removed.append(step.name)
        elif step.state in DONE_STEP_STATES:
            history.append(step.name)
        else:
            in_flight.append(step)
    added = [name for name in new.order if name not in kept.values()]
    refused = None
    if in_flight:
        described = ", ".join(f"{s.name!r} ({s.state}, attempt {s.attempt})" for s in in_flight)
        refused = (
            f"version {new.version} has no step for {described}: a step in flight or whose "
            f"outcome is unknown is never dropped; wait for it to end, or --map it to a step "
            f"of version {new.version}"
        )
    return RunPlan(run_id, kept, added, removed, history, refused)


def check_reason(reason: str) -> None:
    if not has_text(reason) or len(reason) > REASON_MAX:
        raise InvalidInputError(f"a reason needs text, at most {REASON_MAX} characters")


def migrate_runs(
    engine: Engine,
    registry: Registry,
    spec: Migration,
    *,
    actor: str,
    reason: str,
    namespace: str,
    dry_run: bool,
) -> list[RunMigration]:
    """Migrate every eligible run, each in a transaction of its own (a refused run is rolled
    back and reported; the others go on). `dry_run`: plan each run under its lock, change
    nothing."""
    check_reason(reason)
    definitions(registry, spec)
    ids = run_transaction(
        engine,
        lambda conn: store.runs_of_version(
            conn, spec.workflow, spec.from_version, ACTIVE_RUN_STATES
        ),
    )
    done: list[RunMigration] = []
    for run_id in ids:
        one = partial(
            migrate_run,
            registry=registry,
            run_id=run_id,
            spec=spec,
            actor=actor,
            reason=reason,
            namespace=namespace,
            dry_run=dry_run,
        )
        try:
            done.append(run_transaction(engine, one))
        except _RefusedError as exc:
            done.append(exc.outcome)
        except InvalidActionError as exc:  # it ended or moved on since it was listed
            gone = RunPlan(run_id, {}, [], [], [], refused=str(exc))
            done.append(RunMigration(run_id, gone, migrated=False, state="-"))
    return done


class _RefusedError(SasflowError):
    """A run the migration refuses (its transaction rolled back)."""

    def __init__(self, outcome: RunMigration) -> None:
        super().__init__(outcome.plan.refused)
        self.outcome = outcome


def migrate_run(
    conn: Connection,
    registry: Registry,
    run_id: int,
    spec: Migration,
    *,
    actor: str,
    reason: str,
    namespace: str,
    dry_run: bool,
) -> RunMigration:
    """Migrate one run in the caller's transaction (see the module docstring); raises
    InvalidActionError when the run is not an eligible run of the migration's version, and a
    refusal (rolled back with the transaction) when one of its steps in flight has no place."""
    old, new = definitions(registry, spec)
    run = lock_run(conn, run_id)
    if (run.workflow, run.version) != (old.name, old.version) or run.state not in (
        ACTIVE_RUN_STATES
    ):
        raise InvalidActionError(
            f"run {run_id} is a {run.state} run of {run.workflow} version {run.version}: only "
            f"pending or running runs of {old.name} version {old.version} are migrated"
        )
    by_name = {
        r.name: OldStep(r.id, r.name, r.state, r.attempt)
        for r in store.lock_forward_steps(conn, run_id)
    }
    planned = plan(run_id, list(by_name.values()), new, spec.renames)
    if planned.refused is not None:
        outcome = RunMigration(run_id, planned, migrated=False, state=run.state)
        if dry_run:
            return outcome
        raise _RefusedError(outcome)
    if dry_run:
        return RunMigration(run_id, planned, migrated=False, state=run.state)
    store.delete_steps(conn, [by_name[name].id for name in planned.removed])
    store.rename_steps(conn, {by_name[o].id: n for o, n in planned.kept.items() if o != n})
    for before, after in planned.kept.items():
        step = by_name[before]
        if step.started:
            store.repoint_started(conn, step.id, new.dependencies[after])
        else:
            store.redefine_not_started(conn, step.id, new, after, run_pool=run.pool)
    added = store.add_steps(
        conn, new, planned.added, run_id=run_id, priority=run.priority, run_pool=run.pool
    )
    store.set_version(conn, run_id, new)
    batch = [
        events.Event(
            run_id=run_id,
            entity="run",
            from_state=run.state,
            to_state=run.state,
            actor=actor,
            reason=f"migrated from version {old.version} to {new.version}: {reason}",
            detail={"from_version": old.version, "to_version": new.version, **planned.diff()},
        )
    ]
    batch += [
        events.step_event(row, None, StepState.WAITING, actor=actor, reason="added by migration")
        for row in added
    ]
    batch += advance_runs(conn, registry, [run_id], actor=actor).events
    events.record(conn, batch)
    notify_ready(conn, namespace)
    return RunMigration(run_id, planned, migrated=True, state=operator.run_state(conn, run_id))
