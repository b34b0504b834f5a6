"""sasflow: a workflow engine on the Scheduler-Agent-Supervisor pattern.

The public API is what this module exports; everything else is internal. Importing it loads no
database driver: `submit_run`, the one name that needs SQLAlchemy, and `Settings` are loaded on
first use, so `import sasflow.agents` in an agent's handler module imports neither SQLAlchemy
nor psycopg, nor pydantic-settings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sasflow.approvals import FieldSpec
from sasflow.commands import SubmitResult
from sasflow.errors import (
    AppLoadError,
    BacklogFullError,
    BrokerUnavailableError,
    ConfigurationError,
    DefinitionError,
    InvalidInputError,
    InvalidMessageError,
    InvalidScheduleError,
    PublishError,
    SasflowError,
    StoreUnavailableError,
    UnknownWorkflowError,
)
from sasflow.policy import Backoff, BreakerPolicy, RetryPolicy, StepPolicy
from sasflow.registry import ExternalAgent, Registry
from sasflow.schedules.definition import Schedule
from sasflow.schedules.timing import CatchUp
from sasflow.waits import Default
from sasflow.workflow import Step, StepContext, Workflow

if TYPE_CHECKING:
    from sasflow.client import submit_run, wait_for_room
    from sasflow.settings import Settings

_LAZY = {
    "submit_run": "sasflow.client",
    "wait_for_room": "sasflow.client",
    "Settings": "sasflow.settings",
}
"""Public names imported when first used: the database side, and the settings (pydantic)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sasflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AppLoadError",
    "BacklogFullError",
    "Backoff",
    "BreakerPolicy",
    "BrokerUnavailableError",
    "CatchUp",
    "ConfigurationError",
    "Default",
    "DefinitionError",
    "ExternalAgent",
    "FieldSpec",
    "InvalidInputError",
    "InvalidMessageError",
    "InvalidScheduleError",
    "PublishError",
    "Registry",
    "RetryPolicy",
    "SasflowError",
    "Schedule",
    "Settings",
    "Step",
    "StepContext",
    "StepPolicy",
    "StoreUnavailableError",
    "SubmitResult",
    "UnknownWorkflowError",
    "Workflow",
    "submit_run",
    "wait_for_room",
]
