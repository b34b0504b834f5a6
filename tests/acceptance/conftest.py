"""Acceptance tests run the `sasflow` CLI processes as subprocesses on the real services."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow.transport.topology import Names
from tests.acceptance.processes import Processes, processes


@pytest.fixture
def procs(tmp_path: Path, database_url: str, names: Names) -> Iterator[Processes]:
    with processes(tmp_path, database_url=database_url, namespace=names.namespace) as p:
        yield p
