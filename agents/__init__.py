"""sasflow agents: handlers for remote services, with retries and circuit breakers."""

from sasflow.agents.agent import Agent, Call
from sasflow.agents.errors import (
    BreakerOpenError,
    PermanentError,
    TransientError,
)

__all__ = [
    "Agent",
    "BreakerOpenError",
    "Call",
    "PermanentError",
    "TransientError",
]
