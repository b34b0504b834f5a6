"""The state machine's vocabulary: the states of runs and steps, the named sets of them, and
the statuses of agents' replies that move steps between them.

`RunState` and `StepState` are `StrEnum`s, so a member *is* its string: it goes into SQL, JSON
and the `events` table unchanged, and a state read back from the database compares equal to
its member (`row.state == StepState.PROCESSED`). A misspelt member is an AttributeError at
import and a mypy error, never a silent no-op UPDATE. Every module names states through this
one; `docs/concepts.md` draws the transitions.

Only plain Python here: agents and the HTTP face import it without loading SQLAlchemy. The SQL
SET fragments shared by the statements (e.g. leaving `processing`) live next to those
statements in `sasflow.store.runs.queries`.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """Where a run is. Terminal: completed, error, compensated, compensation_failed,
    cancelled (an operator may resubmit some of them)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    CANCELLED = "cancelled"


class StepState(StrEnum):
    """Where a step record is (the pattern's state record). Compensation steps take the same
    states as forward steps; their kind says what they are."""

    WAITING = "waiting"
    """Its dependencies are not all processed yet."""
    PENDING = "pending"
    """Ready (or backing off until `not_before`): a scheduler may claim it."""
    PROCESSING = "processing"
    """Claimed: locked by a scheduler, dispatched, with a deadline (`complete_by`)."""
    PROCESSED = "processed"
    ERROR = "error"
    PARKED = "parked"
    """Its failures ran out (or it answered a permanent error) and its policy parks it
    (`on_exhausted="park"`): no claim takes it; the run waits until an operator unparks it
    (pending again, a fresh failure budget) or fails it (error, and the run's failure policy)."""
    SKIPPED = "skipped"
    """Not run: its run failed or its compensation chain stopped first, or its condition did not
    hold or every step it depends on was skipped (docs/concepts.md, "Conditions"): its event's
    reason says which."""
    CANCELLED = "cancelled"


class StepKind(StrEnum):
    """A step of the workflow, or one undoing a processed step (compensation)."""

    FORWARD = "forward"
    COMPENSATION = "compensation"


class OnFailure(StrEnum):
    """A workflow's failure policy: end in `error` with an alert, or compensate."""

    ERROR = "error"
    COMPENSATE = "compensate"


class OnExhausted(StrEnum):
    """What a step whose failures ran out does (`Workflow(on_exhausted=...)`,
    `StepPolicy(on_exhausted=...)`, docs/operations.md "Parked steps"): fail, and the run
    follows its failure policy, or park, and the run waits for an operator."""

    FAIL = "fail"
    PARK = "park"


class OnDeadline(StrEnum):
    """What the supervisor does when a run passes its deadline (`Workflow(deadline=...)`,
    docs/timeouts.md): raise an alert and let it run, cancel it, or cancel it and compensate
    what it did."""

    ALERT = "alert"
    CANCEL = "cancel"
    COMPENSATE = "compensate"


class ReplyStatus(StrEnum):
    """How an attempt ended, as an agent's reply says it (`Reply.status`, docs/protocol.md) and
    the store records it (`StepOutcome.kind`; the value is the reason of the step's event)."""

    OK = "ok"
    """Done: the step is processed with its output."""
    ERROR = "error"
    """A permanent failure: the step goes to error (no retry)."""
    FAILED = "failed"
    """Transient failures outlasted the agent's retries: one failure is counted now."""
    DEFERRED = "deferred"
    """A dependency is unavailable (open breaker): try again later, no failure counted while
    the step is younger than its give-up age."""


class CallbackState(StrEnum):
    """Where an HTTP callback of the outbox is: still to deliver, delivered (a 2xx), or
    given up (after its attempt or age limit; an alert says so)."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


# -- named sets of run states -------------------------------------------------------------

ACTIVE_RUN_STATES = frozenset({RunState.PENDING, RunState.RUNNING})
"""Runs going forward: their steps are claimed and advanced."""

TERMINAL_RUN_STATES = frozenset(
    {
        RunState.COMPLETED,
        RunState.ERROR,
        RunState.COMPENSATED,
        RunState.COMPENSATION_FAILED,
        RunState.CANCELLED,
    }
)
"""Runs that nothing moves any more, unless an operator resubmits them."""

CANCELLABLE_RUN_STATES = ACTIVE_RUN_STATES
"""Runs an operator may cancel."""

RESUBMITTABLE_RUN_STATES = frozenset(
    {RunState.ERROR, RunState.COMPENSATION_FAILED, RunState.COMPENSATED, RunState.CANCELLED}
)
"""Runs an operator may resubmit (a completed one too, but only from a chosen step)."""

RESTART_FROM_SCRATCH_RUN_STATES = frozenset({RunState.COMPENSATED})
"""Runs whose effects were undone: a resubmission runs every step again."""

# -- named sets of step states ------------------------------------------------------------

DONE_STEP_STATES = frozenset({StepState.PROCESSED, StepState.SKIPPED})
"""Steps a run no longer waits for."""

NOT_STARTED_STEP_STATES = frozenset({StepState.WAITING, StepState.PENDING, StepState.PARKED})
"""Steps no agent has been asked to run (for this attempt): they may be skipped or cancelled. A
parked step is one of them: nothing runs it until an operator acts, and a run that fails or is
cancelled meanwhile skips or cancels it."""

QUIET_STEP_STATES = frozenset({StepState.WAITING, StepState.PENDING, StepState.PROCESSING})
"""Step changes recorded in the history but not published as status notifications."""


class AgentState(StrEnum):
    """Where an agent instance of the fleet is (`agent_instances.state`, `sasflow agents list`)."""

    LIVE = "live"
    """It heartbeats."""
    LOST = "lost"
    """It missed LOST_AFTER_MISSED heartbeats (judged on the database clock): presumed dead."""
    STOPPED = "stopped"
    """It said goodbye on a clean exit."""


LOST_AFTER_MISSED = 3
"""Heartbeats an agent instance may miss before it is `lost`."""
