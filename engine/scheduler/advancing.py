"""The advance duty: runs whose advance was left for a scheduler that has their workflow
version loaded (`runs.advance_due`, store.runs.deferred), advanced off the store's
transactions.

A pass takes a batch of those runs whose version this scheduler has loaded (held for it),
decides each from its snapshot to learn what user code it needs (input builders, the run's
output), hands each call to the user-code pool (sasflow.scheduler.usercode) and goes on; a
later pass, woken when a call ends or its budget does, decides the run again from its rows
with what was built, in a short transaction. A run that needs no user code (one left by a
scheduler without its version) is advanced in the same pass.

Every `missing_check_s` it also looks for runs that have waited more than `missing_after_s`
for a version that no live scheduler has loaded, and raises one `version_missing` alert per
such version.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sasflow.commands import StoredError
from sasflow.errors import BrokerUnavailableError, StoreUnavailableError
from sasflow.messages import safe_text
from sasflow.scheduler.context import Context, Part
from sasflow.scheduler.duty import INF, Duty
from sasflow.scheduler.outbox import RelayDuty
from sasflow.scheduler.usercode import OUTPUT, Job, UserCode, UserCodeOptions
from sasflow.store.cluster import versions
from sasflow.store.db import transaction
from sasflow.store.runs import deferred
from sasflow.store.runs.decide import BuildFailed, Built, NeedsAdvance, decide, outputs_of
from sasflow.workflow import StepContext, Workflow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdvanceOptions:
    """The advance duty's tuning (`SchedulerOptions.advance`)."""

    interval: float = 1.0
    """Seconds between two looks for runs to advance when nothing woke the duty (a run left
    by another scheduler waits at most this long)."""
    batch: int = 50
    user_code: UserCodeOptions = field(default_factory=UserCodeOptions)
    missing_after_s: float = 60.0
    """Runs waiting this long for a version no live scheduler has loaded raise
    `version_missing`."""
    missing_check_s: float = 10.0


@dataclass
class _Building:
    """A run whose user code runs: its jobs, and what they built so far."""

    jobs: list[Job]
    inputs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    output_built: bool = False


class AdvanceDuty(Part, Duty):
    """See the module docstring."""

    def __init__(
        self, ctx: Context, options: AdvanceOptions, *, outbox: RelayDuty, woken: threading.Event
    ) -> None:
        super().__init__(ctx)
        self._options = options
        self._outbox = outbox
        self._woken = woken
        """Set: look for runs to advance at the next pass (this scheduler deferred one)."""
        self._loaded = tuple((w.name, w.version) for w in self._registry.workflows)
        self._workflows = {(w.name, w.version): w for w in self._registry.workflows}
        self._user_code = UserCode(options.user_code, self._job_ended)
        self._building: dict[int, _Building] = {}
        self._ended = threading.Event()
        self._missing_due = 0.0
        self._take_due = 0.0

    def close(self) -> None:
        self._user_code.close()

    def reset(self) -> None:
        super().reset()
        self._take_due = 0.0
        # Runs held for builds of a lost connection's passes are kept: the pool runs on.

    def _job_ended(self) -> None:
        """From a pool thread: wake the loop to read the result."""
        self._ended.set()
        with contextlib.suppress(BrokerUnavailableError):
            self._transport.call_threadsafe(lambda: None)

    def run(self, t: float) -> float:
        built: dict[int, Built] = {}
        if self._building and (self._ended.is_set() or t >= self._earliest_deadline()):
            self._ended.clear()
            built.update(self._collect(t))
        if self._loaded and (self._woken.is_set() or t >= self._take_due):
            self._woken.clear()
            built.update(self._take())
            self._take_due = t + self._options.interval
        if built:
            self._advance_built(built)
        if t >= self._missing_due:
            self._missing_due = t + self._options.missing_check_s
            self._check_missing()
        self.due = min(
            self._take_due if self._loaded else INF, self._missing_due, self._earliest_deadline()
        )
        return INF

    def _earliest_deadline(self) -> float:
        return min((j.deadline for b in self._building.values() for j in b.jobs), default=INF)

    def _take(self) -> dict[int, Built]:
        """Hold runs to advance and start their user code; those that need none are built."""
        room = self._options.batch - len(self._building)
        if room <= 0:
            return {}
        hold = 2 * self._options.user_code.budget_s + 5.0
        with transaction(self._engine) as conn:
            taken = deferred.take(conn, self._loaded, batch=room, hold_s=hold)
        ready: dict[int, Built] = {}
        for snapshot in taken:
            if snapshot.run.id in self._building:
                continue  # its hold lapsed while it built: the builds under way go on
            workflow = self._workflows[(snapshot.run.workflow, snapshot.run.version)]
            jobs = self._start(workflow, snapshot)
            if jobs:
                self._building[snapshot.run.id] = _Building(jobs)
            else:
                ready[snapshot.run.id] = Built()
        return ready

    def _start(self, workflow: Workflow, snapshot: deferred.Snapshot) -> list[Job]:
        """The user code the run's snapshot needs, started."""
        run = snapshot.run
        ctx = StepContext(
            run_input=run.input,
            outputs=outputs_of(snapshot.steps),
            run_id=run.id,
            business_key=run.business_key,
        )
        jobs = []
        for transition in decide(run, snapshot.steps, workflow):
            if isinstance(transition, NeedsAdvance):
                keys: Sequence[str] = (*transition.steps, *((OUTPUT,) if transition.output else ()))
                jobs += [self._user_code.submit(workflow, run.id, key, ctx) for key in keys]
        return jobs

    def _collect(self, t: float) -> dict[int, Built]:
        """The runs whose every job ended (or overran its budget), with what they built."""
        done: dict[int, Built] = {}
        budget = self._options.user_code.budget_s
        for run_id, building in list(self._building.items()):
            running = []
            for job in building.jobs:
                result = job.result(t, budget)
                if result is None:
                    running.append(job)
                elif job.key == OUTPUT:
                    building.output, building.output_built = result, True
                else:
                    building.inputs[job.key] = result
                if isinstance(result, BuildFailed):
                    log.warning("%s: run %s: %s", self._id, run_id, result.error.message)
            building.jobs = running
            if not running:
                del self._building[run_id]
                done[run_id] = Built(building.inputs, building.output, building.output_built)
        return done

    def _advance_built(self, built: dict[int, Built]) -> None:
        """Advance the runs with what was built, together; when the store refuses the batch
        for another reason than being away (a built value jsonb cannot hold, say), each run
        alone, and a run refused alone fails the steps it built with the store's reason."""
        try:
            self._advance_together(built)
        except StoreUnavailableError:
            raise  # the runs' holds lapse and they are built again
        except Exception:
            log.exception("%s: advancing %d runs failed; one by one", self._id, len(built))
            for run_id, made in built.items():
                try:
                    self._advance_together({run_id: made})
                except StoreUnavailableError:
                    raise
                except Exception as exc:
                    log.exception("%s: run %s cannot take what was built", self._id, run_id)
                    self._advance_together({run_id: _refused(made, exc)})

    def _advance_together(self, built: dict[int, Built]) -> None:
        with transaction(self._engine) as conn:
            report = deferred.advance(
                conn, self._registry, built, namespace=self._names.namespace, actor=self._id
            )
            self._hooks.runs_finished(conn, report.finished)
        self._outbox.recorded()
        if report.ready:
            self._wake.set()  # claim the steps made ready
        if report.deferred:
            self._woken.set()

    def _check_missing(self) -> None:
        """Raise `version_missing` for versions runs wait for and no live scheduler has;
        resolve those a live scheduler has now."""
        after = self._options.missing_after_s
        with transaction(self._engine) as conn:
            loaded = versions.loaded_by_live(conn)
            if loaded is None:
                return  # an older live scheduler does not say what it has
            waiting = versions.waiting_versions(conn, older_than_s=after)
            missing = {key: {"waiting_s": after} for key in waiting if key not in loaded}
            if missing:
                deferred.raise_missing(conn, missing, actor=self._id)
                for workflow, version in sorted(missing):
                    log.warning(
                        "%s: runs of %s v%s wait and no live scheduler has that version loaded",
                        self._id,
                        workflow,
                        version,
                    )
            deferred.resolve_missing(conn, loaded, actor=self._id)


def _refused(built: Built, exc: Exception) -> Built:
    """`built` with every value the store refused replaced by the reason."""
    reason = safe_text(f"the store refused it: {exc}")
    inputs = {
        name: value
        if isinstance(value, BuildFailed)
        else BuildFailed(StoredError("InvalidInputError", f"step {name!r}: input {reason}"))
        for name, value in built.inputs.items()
    }
    output = built.output
    if built.output_built and not isinstance(output, BuildFailed):
        output = BuildFailed(StoredError("InvalidOutputError", f"run output {reason}"))
    return Built(inputs, output, built.output_built)
