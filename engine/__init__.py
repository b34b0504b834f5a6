"""sasflow: a workflow engine on the Scheduler-Agent-Supervisor pattern.

The public API is what this module exports; everything else is internal.
"""

from sasflow.client import submit_run
from sasflow.errors import (
    AppLoadError,
    BrokerUnavailableError,
    ConfigurationError,
    DefinitionError,
    InvalidInputError,
    InvalidMessageError,
    PublishError,
    SasflowError,
    StoreUnavailableError,
    UnknownWorkflowError,
)
from sasflow.policy import Backoff, BreakerPolicy, RetryPolicy, StepPolicy
from sasflow.registry import ExternalAgent, Registry
from sasflow.settings import Settings
from sasflow.store.submit import SubmitResult
from sasflow.workflow import Step, StepContext, Workflow

__all__ = [
    "AppLoadError",
    "Backoff",
    "BreakerPolicy",
    "BrokerUnavailableError",
    "ConfigurationError",
    "DefinitionError",
    "ExternalAgent",
    "InvalidInputError",
    "InvalidMessageError",
    "PublishError",
    "Registry",
    "RetryPolicy",
    "SasflowError",
    "Settings",
    "Step",
    "StepContext",
    "StepPolicy",
    "StoreUnavailableError",
    "SubmitResult",
    "UnknownWorkflowError",
    "Workflow",
    "submit_run",
]
