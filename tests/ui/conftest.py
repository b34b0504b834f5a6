"""The console in a real browser: headless Chromium from Debian's `chromium` package (which
`scripts/services.sh` installs and names in SASFLOW_CHROMIUM), driven by Playwright, against
a real `sasflow api` process and scheduler/agent roles on PostgreSQL and RabbitMQ.

One server, one database and one namespace serve the whole package's module; each test makes
its own runs (its own keys) and asserts on them. Screenshots go to a temporary directory, or
to SASFLOW_CONSOLE_SCREENSHOTS when set (`scripts/console_screenshots` sets it to
docs/console/)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import ViewportSize
from sqlalchemy import Engine

from sasflow.scheduler.cluster.member import ClusterOptions
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.server import ApiServer, api_server
from tests.apps import ops

WIDE = ViewportSize(width=1280, height=900)
PHONE = ViewportSize(width=390, height=844)


def chromium() -> str:
    """The Chromium executable: SASFLOW_CHROMIUM, else `chromium` on PATH."""
    found = os.environ.get("SASFLOW_CHROMIUM") or shutil.which("chromium")
    if not found:
        pytest.fail(
            "no Chromium: install Debian's chromium (`. scripts/services.sh` does) or set "
            "SASFLOW_CHROMIUM to its executable"
        )
    return found


@pytest.fixture(scope="session")
def base_url() -> None:
    """No base URL: the tests name the console's server in each address. (Replaces
    pytest-base-url's fixture, which pytest 9 warns about: warnings are errors here.)"""
    return


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """pytest-playwright's launch options, pointed at Debian's Chromium."""
    return {**browser_type_launch_args, "executable_path": chromium(), "headless": True}


@pytest.fixture(scope="module")
def module_names(broker_namespaces: set[str]) -> Names:
    """The module's namespace; what it leaves goes in the session's sweep."""
    names = Names(services.unique("sftest"))
    broker_namespaces.add(names.namespace)
    return names


@pytest.fixture(scope="module")
def store(module_database: str) -> Iterator[Engine]:
    engine = make_engine(module_database, application_name="sasflow-test")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def system(store: Engine, module_database: str, module_names: Names) -> Iterator[None]:
    """A scheduler and the `remote` agent of tests.apps.ops, in threads."""
    with harness.running(
        harness.scheduler(
            store,
            module_database,
            ops.registry,
            module_names,
            rescan_interval=0.1,
            # named, so that the screenshots show no host name of the machine they were taken on
            cluster=ClusterOptions(name="scheduler-1", address="127.0.0.1"),
        ),
        harness.agent(ops.remote, module_names),
    ):
        yield


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory,
    module_database: str,
    module_names: Names,
    system: None,
) -> Iterator[ApiServer]:
    with api_server(
        tmp_path_factory.mktemp("console"),
        database_url=module_database,
        broker_url=services.broker_url(),
        namespace=module_names.namespace,
        app="tests.apps.ops",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go."""
    chosen = os.environ.get("SASFLOW_CONSOLE_SCREENSHOTS")
    if chosen:
        Path(chosen).mkdir(parents=True, exist_ok=True)
        return Path(chosen)
    return tmp_path_factory.mktemp("screenshots")
