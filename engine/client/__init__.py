"""Clients of sasflow: `submit_run` records a run in the caller's own database transaction
(`wait_for_room` waits for room in a workflow's backlog before it, in transactions of its own);
`Client` talks to `sasflow api` over HTTP (REST tasks and the subscription stream).

Names load on first use: `from sasflow.client import Client` loads httpx but not SQLAlchemy,
and `submit_run` loads the store but not httpx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sasflow.client.backlog import wait_for_room
    from sasflow.client.errors import ApiError
    from sasflow.client.http import Client, Page
    from sasflow.client.submit import submit_run
    from sasflow.client.subscription import StreamFilter, StreamUpdate, Subscription

_LAZY = {
    "submit_run": "sasflow.client.submit",
    "Client": "sasflow.client.http",
    "ApiError": "sasflow.client.errors",
    "Page": "sasflow.client.http",
    "Subscription": "sasflow.client.subscription",
    "StreamFilter": "sasflow.client.subscription",
    "StreamUpdate": "sasflow.client.subscription",
    "wait_for_room": "sasflow.client.backlog",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sasflow.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ApiError",
    "Client",
    "Page",
    "StreamFilter",
    "StreamUpdate",
    "Subscription",
    "submit_run",
    "wait_for_room",
]
