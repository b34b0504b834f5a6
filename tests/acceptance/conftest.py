"""Acceptance tests run the `sasflow` CLI processes as subprocesses on the real services."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sasflow.transport.topology import Names
from tests import services
from tests.acceptance.processes import Processes, processes
from tests.api.server import ApiServer, api_server


@pytest.fixture
def procs(tmp_path: Path, database_url: str, names: Names) -> Iterator[Processes]:
    with processes(tmp_path, database_url=database_url, namespace=names.namespace) as p:
        yield p


FAST_STREAM: dict[str, str | None] = {
    "SASFLOW_API_STREAM_HEARTBEAT_S": "0.5",
    "SASFLOW_API_STREAM_RESEND_S": "30",
}
"""Heartbeats every 0.5 s: a dead stream, and a stopped client, show within seconds."""

Serve = Callable[[str], ApiServer]


@pytest.fixture
def serve(tmp_path: Path, database_url: str, names: Names) -> Iterator[Serve]:
    """Starts `sasflow api` processes (PostgreSQL, this test's namespace), all stopped at the
    end of the test."""
    with contextlib.ExitStack() as stack:

        def start(name: str) -> ApiServer:
            return stack.enter_context(
                api_server(
                    tmp_path,
                    database_url=database_url,
                    broker_url=services.broker_url(),
                    namespace=names.namespace,
                    env=FAST_STREAM,
                    name=name,
                )
            )

        yield start
