"""What every request handler reaches: the database, the registry, the settings, the broker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request

from sasflow.doors import BacklogGate
from sasflow.hooks import NO_HOOKS, Hooks
from sasflow.messages import Limits
from sasflow.registry import Registry
from sasflow.schema_watch import SchemaWatch
from sasflow.settings import Settings
from sasflow.store.db import Connection, Engine, run_transaction

T = TypeVar("T")


@dataclass(frozen=True)
class ApiContext:
    """One per API server, built by `sasflow api` (or a test) and kept on `app.state`.

    `check_broker` raises BrokerUnavailableError when the broker cannot be reached (/readyz);
    the in-process bus has nothing to reach and passes. `hooks` hear the door's refusals
    (metrics); `backlog` is the server's reads of each workflow's backlog; `schema` says once
    that the database's schema is not at head (/readyz, the callback loop and the streams
    tell it)."""

    engine: Engine
    registry: Registry
    settings: Settings
    check_broker: Callable[[], None]
    hooks: Hooks = NO_HOOKS
    backlog: BacklogGate = field(init=False)
    schema: SchemaWatch = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backlog", BacklogGate(self.settings.max_backlog))
        object.__setattr__(self, "schema", SchemaWatch(self.engine, "api"))

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def limits(self) -> Limits:
        """The message limits submissions are checked against (what the submitter accepts)."""
        return self.settings.limits()

    def transaction(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in one transaction (retried on a deadlock or serialization failure)."""
        return run_transaction(self.engine, work)


def get_context(request: Request) -> ApiContext:
    """The FastAPI dependency that hands a handler its server's context."""
    ctx: ApiContext = request.app.state.sasflow
    return ctx
