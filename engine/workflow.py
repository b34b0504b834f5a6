"""Workflow definitions: a named, versioned graph of steps, validated when it is built."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from sasflow.approvals import APPROVAL_EVENT, RESERVED_EVENT_PREFIX, ApprovalSpec, FieldSpec
from sasflow.children import CHILD_AGENT, MAX_CHILDREN, ChildSpec
from sasflow.errors import DefinitionError
from sasflow.maps import MapSpec
from sasflow.policy import ExhaustedPolicy, StepPolicy, exhausted_policy
from sasflow.states import OnDeadline, OnExhausted, OnFailure
from sasflow.waits import EVENT_AGENT, Default, WaitSpec
from sasflow.when import All, Cond, Condition, Not
from sasflow.when import Any as AnyOf

JSON = Any
"""A value that json.dumps accepts."""

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
WORKFLOW_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")
"""Workflow names are one word of the status routing key `<workflow>.<run|step>.<state>`."""

FailurePolicy = Literal["error", "compensate"]
"""The values of `OnFailure` as a definition may spell them."""
DeadlinePolicy = Literal["alert", "cancel", "compensate"]
"""The values of `OnDeadline` as a definition may spell them."""
IfSkipped = Literal["skip", "run"]
"""What a step whose dependencies were all skipped does (`Step(if_skipped=...)`)."""


@dataclass(frozen=True)
class StepContext:
    """What a step's input builder sees: the run's input and the outputs of processed steps."""

    run_input: JSON
    outputs: Mapping[str, JSON]
    run_id: int
    business_key: str


InputBuilder = Callable[[StepContext], JSON]
UntilBuilder = Callable[[StepContext], datetime]
"""A timer step's wake-up time, computed from the run's data (timezone-aware)."""

TIMER_AGENT = "sasflow.timer"
"""The agent name of timer steps (`Step.sleep`): reserved, no agent runs them; the schedulers
mark them processed when their time comes (docs/concepts.md, "Timer steps")."""
TIMER_ACTION = "sleep"


def _default_input(ctx: StepContext) -> JSON:
    return ctx.run_input


@dataclass(frozen=True)
class _Until:
    """A timer's `until` as its step's input builder: `{"until": ISO 8601}`, run off the loop
    by the advance duty like any input builder; a naive or non-datetime value is its
    failure."""

    until: UntilBuilder

    def __call__(self, ctx: StepContext) -> JSON:
        moment = self.until(ctx)
        if not isinstance(moment, datetime) or moment.utcoffset() is None:
            raise TypeError(f"until must return a timezone-aware datetime, got {moment!r}")
        return {"until": moment.isoformat()}


@dataclass(frozen=True)
class Step:
    """One step: which agent and action run it, what it waits for, and its policy.

    `after=None` (the default) makes the step follow the step listed before it, so a plain list
    of steps is a sequence; `after=()` makes it a root; `after=("a", "b")` a fan-in.
    """

    name: str
    agent: str
    action: str
    after: tuple[str, ...] | None = None
    input: InputBuilder = _default_input
    policy: StepPolicy = field(default_factory=StepPolicy)
    compensate: str | None = None
    """Action of the same agent that undoes this step once processed, when its run is
    compensated (it failed and its workflow compensates, or an operator cancelled it with
    compensation)."""
    pool: str | None = None
    """The agent pool that must run it (`sasflow agent --pool NAME`); None: the run's pool,
    else the agent's shared queue."""
    sleep_s: float | None = None
    """A timer step's fixed sleep (`Step.sleep(name, seconds=...)`); None otherwise."""
    wait: WaitSpec | None = None
    """An event wait's definition (`Step.wait_for`, `Step.approval`); None otherwise."""
    when: Condition | None = None
    """It runs only when this condition (sasflow.when) holds over the run's input and the
    outputs of the steps it depends on, directly or not; otherwise it is skipped
    (docs/concepts.md, "Conditions"). None: always."""
    if_skipped: IfSkipped = "skip"
    """When every step it depends on was skipped: "skip" it too, or "run" it (its condition,
    if any, still decides). A step with one processed dependency runs either way."""
    approval_spec: ApprovalSpec | None = None
    """An approval's definition (`Step.approval`); None otherwise."""
    map_spec: MapSpec | None = None
    """A map step's definition (`Step.map`): it runs once per item of a list; None
    otherwise."""
    child_spec: ChildSpec | None = None
    """A child step's definition (`Step.child`): it runs another workflow; None otherwise."""

    @classmethod
    def child(
        cls,
        name: str,
        *,
        workflow: str,
        version: int | None = None,
        input: str | None = None,  # noqa: A002 - what it is
        after: tuple[str, ...] | None = None,
        when: Condition | None = None,
        if_skipped: IfSkipped = "skip",
    ) -> Step:
        """A child step: no agent runs it; when it becomes ready a run of `workflow` (`version`,
        None: the latest registered) is submitted with the input at `input` (`input.<field>...`,
        `steps.<step>` or `steps.<step>.<field>...`; None: this run's input), keyed
        `parent:<run id>:<step>` so it is created once. It is processed with the child's
        output when the child completes, and fails (the run's failure policy) with the
        child's error when it ends otherwise. Cancelling or pausing the parent cascades to
        its children; a parent that compensates compensates its completed children in reverse
        order (docs/concepts.md, "Child workflows"). Not a root step."""
        spec = ChildSpec.of(name, workflow, version, input)
        return cls(
            name,
            CHILD_AGENT,
            workflow,
            after=after,
            when=when,
            if_skipped=if_skipped,
            child_spec=spec,
        )

    @classmethod
    def map(
        cls,
        name: str,
        *,
        agent: str,
        action: str,
        items: str,
        max_items: int = 1000,
        parallelism: int = 10,
        on_item_failure: str = "fail_fast",
        after: tuple[str, ...] | None = None,
        policy: StepPolicy | None = None,
        compensate: str | None = None,
        pool: str | None = None,
        when: Condition | None = None,
        if_skipped: IfSkipped = "skip",
    ) -> Step:
        """A map step: `action` of `agent` runs once per item of the list at `items`
        (`input.<field>...` or `steps.<step>.<field>...`), each item a step record of its own
        (`name[index]`: own attempts, deadline, idempotency key and failures) whose input is
        the item. At most `parallelism` items of the run are pending or processing at once;
        more than `max_items` items, or no list at the path, fails the map. Its output is the
        items' outputs in item order (`on_item_failure="continue"`: `{"results": [...],
        "failed": [indexes], "errors": [...]}`). `on_item_failure`: "fail_fast", "continue"
        or "compensate" (docs/concepts.md, "Map steps"). Not a root step."""
        spec = MapSpec.of(name, items, max_items, parallelism, on_item_failure)
        return cls(
            name,
            agent,
            action,
            after=after,
            policy=policy if policy is not None else StepPolicy(),
            compensate=compensate,
            pool=pool,
            when=when,
            if_skipped=if_skipped,
            map_spec=spec,
        )

    @classmethod
    def sleep(
        cls,
        name: str,
        *,
        seconds: float | None = None,
        until: UntilBuilder | None = None,
        after: tuple[str, ...] | None = None,
    ) -> Step:
        """A timer step: no agent runs it; it becomes processed, with the output
        `{"slept_until": ISO 8601}`, once `seconds` have passed since it became ready, or at the
        time `until(ctx)` returns (a timezone-aware datetime, computed from the run's data when
        the step becomes ready; a past time is due at once). Times are the database's clock.
        Exactly one of `seconds` and `until`. A timer cannot be a root step: a run that starts
        later is submitted with `start_at`."""
        if (seconds is None) == (until is None):
            raise DefinitionError(f"timer step {name!r}: give exactly one of seconds and until")
        if seconds is not None and not (
            isinstance(seconds, int | float)
            and not isinstance(seconds, bool)
            and math.isfinite(seconds)
            and seconds >= 0
        ):
            raise DefinitionError(f"timer step {name!r}: seconds must be >= 0, got {seconds!r}")
        if until is not None and not callable(until):
            raise DefinitionError(f"timer step {name!r}: until must be callable")
        return cls(
            name,
            TIMER_AGENT,
            TIMER_ACTION,
            after=after,
            input=_Until(until) if until is not None else _default_input,
            sleep_s=None if seconds is None else float(seconds),
        )

    @classmethod
    def wait_for(
        cls,
        name: str,
        *,
        event: str,
        match: str,
        timeout: float,
        on_timeout: str | Default = "fail",
        after: tuple[str, ...] | None = None,
    ) -> Step:
        """An event wait: no agent runs it; it becomes processed, with the event's payload as
        its output, when an event named `event` arrives whose correlation equals the value at
        `match` (`input.<field>...` or `steps.<step>.<field>...`, compared as text), whether the
        event arrived before the wait opened (within its retention) or after. `timeout` seconds
        after it opened (database clock), `on_timeout` applies: "fail" (the run's failure
        policy), "compensate" (the run compensates) or `Default(value)` (the step completes
        with `value`). Not a root step."""
        check_name(f"event wait {name!r}: event", event)
        if event.startswith(RESERVED_EVENT_PREFIX):
            raise DefinitionError(
                f"event wait {name!r}: event names starting with {RESERVED_EVENT_PREFIX!r} are "
                "reserved (an approval is Step.approval)"
            )
        spec = WaitSpec.of(name, event, match, timeout, on_timeout)
        return cls(name, EVENT_AGENT, event, after=after, wait=spec)

    @classmethod
    def approval(
        cls,
        name: str,
        *,
        approvers: str = "approve",
        form: Mapping[str, FieldSpec | type | Sequence[str]] | None = None,
        timeout: float,
        on_timeout: str | Default = "fail",
        escalate_after: float | None = None,
        after: tuple[str, ...] | None = None,
    ) -> Step:
        """An approval: an event wait whose event is a person's decision (docs/concepts.md,
        "Approvals"). A token with the scope `approve` (`approvers="approve"`, the default) or
        `approve:<approvers>` (a named group), or `admin`, approves it with the `form`'s fields
        (field -> `str`, `int`, `float`, `bool`, a list of choices, or a `FieldSpec`), which
        become its output with `decision`, `by`, `at` and `comment`; or rejects it with a
        reason: it fails (the run's failure policy, or parking, applies). `timeout` and
        `on_timeout` as for `wait_for`; `escalate_after` seconds after it opened with no
        decision, one `approval_overdue` alert. Not a root step."""
        check_name("approval", name)
        wait = WaitSpec.of(name, APPROVAL_EVENT, "input.approval", timeout, on_timeout)
        spec = ApprovalSpec.of(name, approvers, form, escalate_after)
        return cls(name, EVENT_AGENT, APPROVAL_EVENT, after=after, wait=wait, approval_spec=spec)

    @property
    def is_approval(self) -> bool:
        """True for an approval (`Step.approval`), an event wait decided by a person."""
        return self.approval_spec is not None

    @property
    def is_child(self) -> bool:
        """True for a child step (`Step.child`): a run of another workflow, no agent."""
        return self.agent == CHILD_AGENT

    @property
    def is_event_wait(self) -> bool:
        """True for an event wait (`Step.wait_for`): the schedulers, not an agent, process it."""
        return self.agent == EVENT_AGENT

    @property
    def is_timer(self) -> bool:
        """True for a timer step (`Step.sleep`): the schedulers, not an agent, process it."""
        return self.agent == TIMER_AGENT

    @property
    def takes_run_input(self) -> bool:
        """True when its input is the run's input as it is (the default input builder)."""
        return self.input is _default_input

    def shape(self) -> dict[str, JSON]:
        """What the fingerprint of its workflow takes of it (see `Workflow.fingerprint`)."""
        return {
            "name": self.name,
            "agent": self.agent,
            "action": self.action,
            "input": None if self.takes_run_input else qualified_name(self._builder),
            "policy": _policy_shape(self.policy),
            "compensate": self.compensate,
            "pool": self.pool,
            # Only a timer's: the fingerprints of versions recorded before timers stay the same.
            **({"sleep_s": self.sleep_s} if self.is_timer else {}),
            **({"wait": self.wait.shape()} if self.wait is not None else {}),
            # Only when set: the fingerprints of versions recorded before conditions stay.
            **({"when": self.when.shape()} if self.when is not None else {}),
            **({"if_skipped": self.if_skipped} if self.if_skipped != "skip" else {}),
            **({"approval": self.approval_spec.shape()} if self.approval_spec else {}),
            **({"map": self.map_spec.shape()} if self.map_spec is not None else {}),
            **({"child": self.child_spec.shape()} if self.child_spec is not None else {}),
        }

    @property
    def _builder(self) -> Callable[..., object]:
        """The user's function behind its input: a timer's `until`, or its input builder."""
        return self.input.until if isinstance(self.input, _Until) else self.input


def _policy_shape(policy: StepPolicy) -> dict[str, JSON]:
    """A step policy as its fingerprint takes it: the parking options only when set, so the
    fingerprints of versions recorded before parking stay the same."""
    shape: dict[str, JSON] = dataclasses.asdict(policy)
    for name in ("on_exhausted", "on_error"):
        if shape[name] is None:
            del shape[name]
    return shape


def qualified_name(function: Callable[..., object]) -> str:
    """`module.qualname` of a builder: what a fingerprint knows of user code."""
    module = getattr(function, "__module__", None) or "?"
    return f"{module}.{getattr(function, '__qualname__', type(function).__qualname__)}"


def check_name(kind: str, name: str) -> None:
    """Raise DefinitionError unless `name` is usable in queue names and routing keys."""
    if not NAME_PATTERN.fullmatch(name):
        raise DefinitionError(
            f"{kind} name {name!r} must match {NAME_PATTERN.pattern} "
            "(letters, digits, '_', '.', '-'; at most 100 characters)"
        )


class Workflow:
    """A validated, immutable workflow definition."""

    def __init__(
        self,
        name: str,
        steps: Sequence[Step],
        *,
        version: int = 1,
        on_failure: OnFailure | FailurePolicy = OnFailure.ERROR,
        output: Callable[[StepContext], JSON] | None = None,
        deadline: float | None = None,
        on_deadline: OnDeadline | DeadlinePolicy = OnDeadline.ALERT,
        max_backlog: int | None = None,
        on_exhausted: OnExhausted | ExhaustedPolicy = OnExhausted.FAIL,
        on_error: OnExhausted | ExhaustedPolicy | None = None,
    ) -> None:
        """`deadline`: seconds from submission (on the database clock) within which a run should
        end; past it the supervisor does `on_deadline` (docs/timeouts.md). None: no deadline.
        `max_backlog`: the most runs of this workflow that may wait to start before the
        doors push back (docs/backpressure.md); None: the process's setting
        (SASFLOW_MAX_BACKLOG), 0: no bound. `on_exhausted`: what a step whose failures ran out
        does, `fail` (the run follows `on_failure`) or `park` (it waits for an operator,
        docs/operations.md "Parked steps"); `on_error`: what a step answered with a permanent
        `error` does (None: as `on_exhausted`). A step's policy may say otherwise."""
        if not WORKFLOW_NAME_PATTERN.fullmatch(name):
            raise DefinitionError(
                f"workflow name {name!r} must match {WORKFLOW_NAME_PATTERN.pattern} "
                "(letters, digits, '_', '-'; no dots; at most 100 characters)"
            )
        if version < 1:
            raise DefinitionError(f"workflow {name!r}: version must be >= 1, got {version}")
        if on_failure not in set(OnFailure):
            raise DefinitionError(f"workflow {name!r}: on_failure must be 'error' or 'compensate'")
        if not steps:
            raise DefinitionError(f"workflow {name!r} has no steps")
        if deadline is not None and not (
            isinstance(deadline, int | float)
            and not isinstance(deadline, bool)
            and math.isfinite(deadline)
            and deadline > 0
        ):
            raise DefinitionError(f"workflow {name!r}: deadline must be > 0, got {deadline!r}")
        if on_deadline not in set(OnDeadline):
            raise DefinitionError(
                f"workflow {name!r}: on_deadline must be 'alert', 'cancel' or 'compensate', "
                f"got {on_deadline!r}"
            )
        if max_backlog is not None and (
            isinstance(max_backlog, bool) or not isinstance(max_backlog, int) or max_backlog < 0
        ):
            raise DefinitionError(
                f"workflow {name!r}: max_backlog must be an integer >= 0 (0: no bound), "
                f"got {max_backlog!r}"
            )
        self.on_exhausted = (
            exhausted_policy(f"workflow {name!r}: on_exhausted", on_exhausted) or OnExhausted.FAIL
        )
        self.on_error = exhausted_policy(f"workflow {name!r}: on_error", on_error)
        self.name = name
        self.max_backlog = max_backlog
        self.version = version
        self.on_failure = OnFailure(on_failure)
        self.deadline: float | None = None if deadline is None else float(deadline)
        self.on_deadline = OnDeadline(on_deadline)
        self._output = output
        self.steps: tuple[Step, ...] = tuple(steps)
        self.steps_by_name: dict[str, Step] = {s.name: s for s in self.steps}
        self.dependencies: dict[str, tuple[str, ...]] = self._resolve_dependencies()
        self.order: tuple[str, ...] = self._topological_order()
        self.successors: dict[str, tuple[str, ...]] = {
            s.name: tuple(o.name for o in self.steps if s.name in self.dependencies[o.name])
            for s in self.steps
        }
        self.terminal_steps: tuple[str, ...] = tuple(
            n for n in self.order if not self.successors[n]
        )
        self.ancestors: dict[str, frozenset[str]] = {}
        """The steps each step depends on, directly or not."""
        for step_name in self.order:
            deps = self.dependencies[step_name]
            self.ancestors[step_name] = frozenset(deps).union(*(self.ancestors[d] for d in deps))
        for step in self.steps:
            self._check_condition(step)
            self._check_map(step)
            self._check_child(step)
        children = sum(1 for s in self.steps if s.is_child)
        if children > MAX_CHILDREN:
            raise DefinitionError(
                f"workflow {name!r}: {children} child steps, more than {MAX_CHILDREN} children "
                "per run"
            )

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version}, steps={list(self.order)})"

    @property
    def has_output_builder(self) -> bool:
        """True when the run's output comes from user code (`output=`), not the default."""
        return self._output is not None

    def parks(self, name: str) -> tuple[bool, bool]:
        """Whether step `name` parks (exhausted failures, a permanent error): its policy's
        `on_exhausted` else the workflow's; its policy's `on_error`, else the workflow's, else
        what its failures running out does."""
        policy = self.step(name).policy
        exhausted = policy.on_exhausted or self.on_exhausted
        error = policy.on_error or self.on_error or exhausted
        return exhausted == OnExhausted.PARK, error == OnExhausted.PARK

    @cached_property
    def fingerprint(self) -> str:
        """A stable hash (SHA-256, hex) of what runs of this version depend on: the steps (names,
        agents, actions, dependencies, policies, compensations, pools, conditions), the builders by
        qualified name (not their code: a builder's body may change without the version, as
        long as it reads the same steps), the failure and deadline policies and the output
        builder, and the parking options when they are not the defaults (the fingerprints of
        versions recorded before parking stay the same). Not `max_backlog`: a door's setting, not
        the runs' shape. Two processes with
        the same (name, version) and another fingerprint disagree on what a run is."""
        shape = {
            "name": self.name,
            "version": self.version,
            "on_failure": self.on_failure.value,
            "deadline": self.deadline,
            "on_deadline": self.on_deadline.value,
            "output": qualified_name(self._output) if self._output is not None else None,
            **({"on_exhausted": self.on_exhausted.value} if self.on_exhausted != "fail" else {}),
            **({"on_error": self.on_error.value} if self.on_error is not None else {}),
            "steps": [
                {**step.shape(), "after": list(self.dependencies[step.name])} for step in self.steps
            ],
        }
        text = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def step(self, name: str) -> Step:
        return self.steps_by_name[name]

    def output(self, ctx: StepContext) -> JSON:
        """The run's output once every step is processed: the terminal steps' outputs by default."""
        if self._output is not None:
            return self._output(ctx)
        return {name: ctx.outputs.get(name) for name in self.terminal_steps}

    def _resolve_dependencies(self) -> dict[str, tuple[str, ...]]:
        names: set[str] = set()
        deps: dict[str, tuple[str, ...]] = {}
        previous: str | None = None
        for step in self.steps:
            check_name(f"workflow {self.name!r}: step", step.name)
            check_name(f"workflow {self.name!r}: step {step.name!r}: agent", step.agent)
            check_name(f"workflow {self.name!r}: step {step.name!r}: action", step.action)
            self._check_timer(step)
            if step.compensate is not None:
                check_name(
                    f"workflow {self.name!r}: step {step.name!r}: compensate", step.compensate
                )
            if step.name in names:
                raise DefinitionError(f"workflow {self.name!r}: duplicate step name {step.name!r}")
            names.add(step.name)
            if step.after is None:
                deps[step.name] = () if previous is None else (previous,)
            else:
                if len(set(step.after)) != len(step.after):
                    raise DefinitionError(
                        f"workflow {self.name!r}: step {step.name!r} lists a dependency twice"
                    )
                deps[step.name] = tuple(step.after)
            if step.is_timer and not deps[step.name]:
                raise DefinitionError(
                    f"workflow {self.name!r}: timer step {step.name!r} cannot be a root step "
                    "(submit the run with start_at to start it later)"
                )
            if step.is_event_wait and not deps[step.name]:
                raise DefinitionError(
                    f"workflow {self.name!r}: {'approval' if step.is_approval else 'event wait'} "
                    f"{step.name!r} cannot be a root step "
                    "(it opens when a step before it is processed)"
                )
            previous = step.name
        for step_name, step_deps in deps.items():
            for dep in step_deps:
                if dep not in names:
                    raise DefinitionError(
                        f"workflow {self.name!r}: step {step_name!r} "
                        f"depends on unknown step {dep!r}"
                    )
                if dep == step_name:
                    raise DefinitionError(
                        f"workflow {self.name!r}: step {step_name!r} depends on itself"
                    )
        return deps

    def _check_timer(self, step: Step) -> None:
        """A timer step as `Step.sleep` makes it; no other step uses its agent or `sleep_s`."""
        if step.is_timer and (
            step.action != TIMER_ACTION
            or step.compensate is not None
            or step.pool is not None
            or (step.sleep_s is not None) == isinstance(step.input, _Until)
        ):
            raise DefinitionError(
                f"workflow {self.name!r}: step {step.name!r}: agent {TIMER_AGENT!r} is "
                "reserved for timer steps: declare them with Step.sleep (no compensate, no pool)"
            )
        if step.is_event_wait != (step.wait is not None) or (
            step.wait is not None
            and (step.compensate is not None or step.pool is not None or not step.takes_run_input)
        ):
            raise DefinitionError(
                f"workflow {self.name!r}: step {step.name!r}: agent {EVENT_AGENT!r} is "
                "reserved for event waits: declare them with Step.wait_for (no compensate, no pool)"
            )
        if step.is_approval != (step.wait is not None and step.wait.event == APPROVAL_EVENT):
            raise DefinitionError(
                f"workflow {self.name!r}: step {step.name!r}: event {APPROVAL_EVENT!r} is "
                "reserved for approvals: declare them with Step.approval"
            )
        if step.wait is not None and step.wait.match.source != "input":
            source = step.wait.match.source
            if source not in self.steps_by_name:
                raise DefinitionError(
                    f"workflow {self.name!r}: step {step.name!r}: match reads unknown step "
                    f"{source!r}"
                )
        if not step.is_timer and step.sleep_s is not None:
            raise DefinitionError(
                f"workflow {self.name!r}: step {step.name!r}: sleep_s is for timer steps "
                "(Step.sleep)"
            )

    def _check_condition(self, step: Step) -> None:
        """A condition is `sasflow.when` data reading the input or the steps `step` depends on
        (directly or not): only their outputs exist when it is decided."""
        where = f"workflow {self.name!r}: step {step.name!r}"
        if step.if_skipped not in {"skip", "run"}:
            raise DefinitionError(f"{where}: if_skipped must be 'skip' or 'run'")
        if step.when is None:
            return
        if not isinstance(step.when, Cond | All | AnyOf | Not):
            raise DefinitionError(
                f"{where}: when must be a condition (sasflow.when: Cond, All, Any, Not), "
                f"not {step.when!r}"
            )
        if not self.dependencies[step.name]:
            raise DefinitionError(
                f"{where}: a root step cannot have a condition (it is ready as the run is "
                "submitted: decide before submitting, or put it after a step)"
            )
        for path in step.when.paths():
            if path.source != "input" and path.source not in self.ancestors[step.name]:
                raise DefinitionError(
                    f"{where}: its condition reads {path}, but {path.source!r} is not a step "
                    "it depends on (directly or not)"
                )

    def _check_map(self, step: Step) -> None:
        """A map reads its items from the input or a step it depends on, and follows a step
        (its items are created when it becomes ready)."""
        spec = step.map_spec
        if spec is None:
            return
        where = f"workflow {self.name!r}: map step {step.name!r}"
        if not isinstance(spec, MapSpec) or step.is_timer or step.is_event_wait:
            raise DefinitionError(f"{where}: declare it with Step.map(...)")
        if not step.takes_run_input:
            raise DefinitionError(f"{where}: its input is each item: no input builder")
        if not self.dependencies[step.name]:
            raise DefinitionError(
                f"{where}: a map cannot be a root step (its items are created when it becomes "
                "ready: put it after a step)"
            )
        source = spec.items.source
        if source != "input" and source not in self.ancestors[step.name]:
            raise DefinitionError(
                f"{where}: it reads {spec.items}, but {source!r} is not a step it depends "
                "on (directly or not)"
            )

    def _check_child(self, step: Step) -> None:
        """A child step as `Step.child` makes it: not a root, reading its input from the run's
        input or a step it depends on."""
        spec = step.child_spec
        if not step.is_child and spec is None:
            return
        where = f"workflow {self.name!r}: step {step.name!r}"
        if (
            not isinstance(spec, ChildSpec)
            or not step.is_child
            or step.action != spec.workflow
            or step.compensate is not None
            or step.pool is not None
            or not step.takes_run_input
            or step.map_spec is not None
        ):
            raise DefinitionError(
                f"{where}: agent {CHILD_AGENT!r} is reserved for child steps: declare them with "
                "Step.child (no compensate, no pool, no input builder)"
            )
        if not self.dependencies[step.name]:
            raise DefinitionError(
                f"{where}: a child step cannot be a root step (its child is submitted when it "
                "becomes ready: put it after a step)"
            )
        source = spec.input.source if spec.input is not None else "input"
        if source != "input" and source not in self.ancestors[step.name]:
            raise DefinitionError(
                f"{where}: its input reads {spec.input}, but {source!r} is not a step it "
                "depends on (directly or not)"
            )

    @property
    def child_workflows(self) -> tuple[tuple[str, int | None], ...]:
        """The (workflow, version) its child steps run (version None: the latest)."""
        return tuple(
            (s.child_spec.workflow, s.child_spec.version)
            for s in self.steps
            if s.child_spec is not None
        )

    def _topological_order(self) -> tuple[str, ...]:
        # Kahn's algorithm, stable in declaration order; what is left over depends on a cycle.
        remaining = {name: set(d) for name, d in self.dependencies.items()}
        order: list[str] = []
        while remaining:
            ready = [s.name for s in self.steps if s.name in remaining and not remaining[s.name]]
            if not ready:
                cycle = " -> ".join(sorted(_on_cycles(remaining)))
                raise DefinitionError(
                    f"workflow {self.name!r}: dependency cycle among steps: {cycle}"
                )
            for name in ready:
                order.append(name)
                del remaining[name]
            for deps in remaining.values():
                deps.difference_update(ready)
        return tuple(order)


def _on_cycles(remaining: dict[str, set[str]]) -> set[str]:
    """The steps of a blocked graph that lie on (or between) cycles: peel away the steps that no
    other remaining step depends on, until none is left to peel."""
    left = {name: set(deps) for name, deps in remaining.items()}
    while True:
        needed = set().union(*left.values()) if left else set()
        leaves = [name for name in left if name not in needed]
        if not leaves:
            return set(left)
        for name in leaves:
            del left[name]
