"""sasflow agents: handlers for remote services, with retries and circuit breakers."""

from sasflow.agents.agent import Agent, Call
from sasflow.agents.children import Completed
from sasflow.agents.errors import (
    BreakerOpenError,
    ChildKilledError,
    Defer,
    PermanentError,
    TransientError,
)
from sasflow.agents.transient import TransientHttp

__all__ = [
    "Agent",
    "BreakerOpenError",
    "Call",
    "ChildKilledError",
    "Completed",
    "Defer",
    "PermanentError",
    "TransientError",
    "TransientHttp",
]
