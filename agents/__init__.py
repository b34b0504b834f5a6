"""sasflow agents: handlers for remote services, with retries and circuit breakers."""

from sasflow.agents.agent import Agent, Call
from sasflow.agents.children import Completed
from sasflow.agents.errors import (
    BreakerOpenError,
    ChildKilledError,
    PermanentError,
    TransientError,
)

__all__ = [
    "Agent",
    "BreakerOpenError",
    "Call",
    "ChildKilledError",
    "Completed",
    "PermanentError",
    "TransientError",
]
