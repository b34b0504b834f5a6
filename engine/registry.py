"""The explicit registry of workflows and agents that every sasflow process is given."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sasflow.children import MAX_DEPTH
from sasflow.errors import DefinitionError, UnknownWorkflowError
from sasflow.schedules.definition import Schedule
from sasflow.workflow import Workflow, check_name


class AgentSpec(Protocol):
    """What the registry needs to know of an agent: its name and the actions it serves."""

    @property
    def name(self) -> str: ...

    @property
    def actions(self) -> frozenset[str] | None:
        """The actions it serves, or None when they are not known here (an external agent)."""
        ...


@dataclass(frozen=True)
class ExternalAgent:
    """An agent implemented outside this Python app (another service or language)."""

    name: str
    actions: frozenset[str] | None = None


class Registry:
    """Workflows by (name, version) and agents by name; validated as a whole when built."""

    def __init__(
        self,
        workflows: Iterable[Workflow] = (),
        agents: Iterable[AgentSpec] = (),
        schedules: Iterable[Schedule] = (),
    ) -> None:
        self._agents: dict[str, AgentSpec] = {}
        for agent in agents:
            check_name("agent", agent.name)
            if agent.name in self._agents:
                raise DefinitionError(f"duplicate agent name {agent.name!r}")
            self._agents[agent.name] = agent
        self._workflows: dict[tuple[str, int], Workflow] = {}
        for workflow in workflows:
            key = (workflow.name, workflow.version)
            if key in self._workflows:
                raise DefinitionError(
                    f"workflow {workflow.name!r} version {workflow.version} is registered twice"
                )
            self._check_agents(workflow)
            self._workflows[key] = workflow
        self._check_children()
        self._schedules: dict[str, Schedule] = {}
        for schedule in schedules:
            if schedule.name in self._schedules:
                raise DefinitionError(f"duplicate schedule name {schedule.name!r}")
            self.workflow(schedule.workflow)  # UnknownWorkflowError names it
            self._schedules[schedule.name] = schedule

    def _check_agents(self, workflow: Workflow) -> None:
        for step in workflow.steps:
            if step.is_timer or step.is_event_wait or step.is_child:
                continue  # no agent runs it
            agent = self._agents.get(step.agent)
            where = f"workflow {workflow.name!r} v{workflow.version}, step {step.name!r}"
            if agent is None:
                known = ", ".join(sorted(self._agents)) or "none"
                raise DefinitionError(f"{where}: unknown agent {step.agent!r} (known: {known})")
            actions = agent.actions
            if actions is None:
                continue
            for action in (step.action, step.compensate):
                if action is not None and action not in actions:
                    raise DefinitionError(
                        f"{where}: agent {step.agent!r} has no action {action!r} "
                        f"(it has: {', '.join(sorted(actions)) or 'none'})"
                    )

    def _check_children(self) -> None:
        """No registered workflow is its own descendant through child steps, and none nests
        children deeper than MAX_DEPTH (a child not registered here is checked when it runs)."""
        depths: dict[tuple[str, int], int] = {}

        def depth(key: tuple[str, int], path: tuple[str, ...]) -> int:
            if key in depths:
                return depths[key]
            here = f"{key[0]} v{key[1]}"
            if here in path:
                cycle = " -> ".join((*path[path.index(here) :], here))
                raise DefinitionError(f"workflow {key[0]!r} is its own descendant: {cycle}")
            deepest = 0
            for name, version in self._workflows[key].child_workflows:
                child = self._find(name, version)
                if child is not None:
                    deepest = max(deepest, 1 + depth(child, (*path, here)))
            if deepest > MAX_DEPTH:
                raise DefinitionError(
                    f"workflow {key[0]!r} v{key[1]} nests child workflows {deepest} deep, more "
                    f"than {MAX_DEPTH}"
                )
            depths[key] = deepest
            return deepest

        for key in self._workflows:
            depth(key, ())

    def _find(self, name: str, version: int | None) -> tuple[str, int] | None:
        """The key of workflow `name` at `version` (None: its latest), if registered."""
        versions = [v for (n, v) in self._workflows if n == name]
        if version is None:
            return (name, max(versions)) if versions else None
        return (name, version) if version in versions else None

    @property
    def workflows(self) -> tuple[Workflow, ...]:
        return tuple(self._workflows.values())

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules defined in Python (synced to the database when a scheduler starts)."""
        return tuple(self._schedules.values())

    @property
    def agents(self) -> tuple[AgentSpec, ...]:
        return tuple(self._agents.values())

    def agent(self, name: str) -> AgentSpec:
        try:
            return self._agents[name]
        except KeyError:
            known = names_list(sorted(self._agents))
            raise DefinitionError(f"unknown agent {name!r} (known agents: {known})") from None

    def workflow(self, name: str, version: int | None = None) -> Workflow:
        """The workflow `name` at `version`, or its latest version when `version` is None."""
        if version is not None:
            found = self._workflows.get((name, version))
            if found is None:
                numbers = sorted(v for (n, v) in self._workflows if n == name)
                hint = (
                    f"registered versions of {name!r}: {names_list(map(str, numbers))}"
                    if numbers
                    else self._known_workflows()
                )
                raise UnknownWorkflowError(
                    f"unknown workflow {name!r} version {version}", hint=hint
                )
            return found
        versions = [w for (n, _), w in self._workflows.items() if n == name]
        if not versions:
            raise UnknownWorkflowError(f"unknown workflow {name!r}", hint=self._known_workflows())
        return max(versions, key=lambda w: w.version)

    def _known_workflows(self) -> str:
        return f"known workflows: {names_list(sorted({n for (n, _) in self._workflows}))}"


LISTED_NAMES = 20
"""An error lists this many names at most, then how many more there are."""


def names_list(names: Iterable[str]) -> str:
    """`a, b, c` (`none` when empty), the first LISTED_NAMES and `and N more`."""
    every = list(names)
    shown = ", ".join(every[:LISTED_NAMES]) or "none"
    more = len(every) - LISTED_NAMES
    return f"{shown} and {more} more" if more > 0 else shown
