"""A database whose schema is not at this sasflow's head: never migrated, migrated behind it, or
downgraded under the running roles.

At start every role (and every command that needs the schema) says what `sasflow db check`
says, in one line, with exit status 78. While running, a role says it once, holds its work
and retries quietly, then says once that it resumed after `sasflow db upgrade`; the agents
never touch the database."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from sasflow.cli.main import cli
from sasflow.store import migrate
from sasflow.store.db import make_engine
from sasflow.transport.topology import Names
from tests import services
from tests.acceptance.processes import Processes, processes
from tests.api.server import api_server
from tests.conftest import DatabaseRoles

pytestmark = pytest.mark.acceptance

EX_CONFIG = 78
WITHIN_S = 20.0
HEAD = migrate.head()
PREVIOUS = "0012"
EMPTY = f"database at (empty), head is {HEAD}: run `sasflow db upgrade`"
SAID = "database at (empty), head is"
RESUMED = re.compile(r"schema_watch: .*: database at \d+: resumed")


@pytest.fixture
def empty_database_url(database_roles: DatabaseRoles, template_database: str) -> Iterator[str]:
    """A database of its own that nobody migrated, reached as the runtime role (which the
    template's roles script creates)."""
    assert template_database
    name = services.unique("sasflow_empty")
    services.create_database(name)
    yield services.with_user(services.database_url(name), database_roles.runtime)
    services.drop_database(name)


@pytest.fixture
def empty(tmp_path: Path, empty_database_url: str, names: Names) -> Iterator[Processes]:
    with processes(tmp_path, database_url=empty_database_url, namespace=names.namespace) as p:
        yield p


def _one_line_and_78(procs: Processes, *args: str) -> str:
    """Run `sasflow ARGS`: exit status 78 within seconds, one line of output, no traceback and
    no retry. Returns the line."""
    started = time.monotonic()
    result = procs.run(*args, timeout=WITHIN_S * 2)
    output = result.stdout + result.stderr
    assert result.returncode == EX_CONFIG, output
    assert len(output.splitlines()) == 1, output
    assert "Traceback" not in output
    assert time.monotonic() - started < WITHIN_S
    return output.strip()


ROLES = [
    ("scheduler",),
    ("submitter",),
    ("supervisor",),
    ("supervisor", "--once"),
    ("api", "--port", "0"),
    ("run", "--no-migrate"),
]


@pytest.mark.parametrize("role", ROLES, ids=[" ".join(r) for r in ROLES])
def test_each_role_on_a_database_never_migrated_says_so_with_ex_config(
    empty: Processes, role: tuple[str, ...]
) -> None:
    assert _one_line_and_78(empty, *role) == f"Error: {EMPTY}"


COMMANDS = [
    ("submit", "pipeline", "--input", '{"text": "x"}', "--key", "k"),
    ("runs", "list"),
    ("runs", "show", "1"),
    ("runs", "resubmit", "--dry-run", "--reason", "r"),
    ("alerts", "list"),
    ("alerts", "ack", "1", "--reason", "r"),
    ("agents", "list"),
    ("dead", "list"),
    ("limits", "list"),
    ("schedules", "list"),
    ("schedulers", "list"),
    ("tokens", "list"),
    ("queues", "migrate", "--to", "quorum"),
    ("db", "prune", "--dry-run"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_each_command_that_needs_the_schema_says_so_with_ex_config(
    empty_database_url: str, command: tuple[str, ...], names: Names
) -> None:
    """In-process (CliRunner): the same code as the `sasflow` process, many times faster."""
    done = CliRunner().invoke(
        cli,
        list(command),
        env={
            "SASFLOW_DATABASE_URL": empty_database_url,
            "SASFLOW_BROKER_URL": services.broker_url(),
            "SASFLOW_NAMESPACE": names.namespace,
            "SASFLOW_APP": "tests.apps.basic",
        },
    )
    assert (done.exit_code, done.output) == (EX_CONFIG, f"Error: {EMPTY}\n")


def test_an_agent_needs_no_database(empty: Processes) -> None:
    """Agents never touch the database: one serves whatever the database holds."""
    empty.start("agent", "agent", "echo")
    _wait_for(lambda: "consuming" in empty.log("agent"), "the agent consuming", empty)
    empty.assert_alive()
    assert "database" not in empty.log("agent")


def test_a_role_on_a_database_behind_the_head_names_both_revisions(
    procs: Processes, owner_database_url: str
) -> None:
    engine = make_engine(owner_database_url, pool_size=1)
    try:
        migrate.downgrade(engine, PREVIOUS)
    finally:
        engine.dispose()
    line = _one_line_and_78(procs, "scheduler")
    assert line == f"Error: database at {PREVIOUS}, head is {HEAD}: run `sasflow db upgrade`"


# -- the schema goes away under the running roles ---------------------------------------------


def _wait_for(condition: Callable[[], bool], what: str, procs: Processes) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not seen within 60s: {what}; logs in {procs.logs}")


def _db(owner_database_url: str, *args: str) -> None:
    """`sasflow db ...` as the owner role (the runtime role may not create or drop tables)."""
    done = CliRunner().invoke(cli, ["db", *args], env={"SASFLOW_DATABASE_URL": owner_database_url})
    assert done.exit_code == 0, done.output


def _ready(base_url: str) -> int:
    return httpx.get(f"{base_url}/readyz", timeout=10).status_code


def test_a_schema_downgraded_under_the_running_roles_is_said_once_and_waited_for(
    procs: Processes,
    tmp_path: Path,
    database_url: str,
    owner_database_url: str,
    names: Names,
) -> None:
    procs.start("scheduler", "scheduler")
    procs.start("submitter", "submitter")
    procs.start("supervisor", "supervisor", "--interval", "0.2")
    procs.start("agent", "agent", "echo")
    roles = ("scheduler", "submitter", "supervisor", "api")
    with api_server(
        tmp_path,
        database_url=database_url,
        broker_url=services.broker_url(),
        namespace=names.namespace,
        env={"SASFLOW_API_CALLBACK_POLL_S": "0.2"},
    ) as api:
        logs: dict[str, Callable[[], str]] = {
            name: functools.partial(procs.log, name) for name in roles if name != "api"
        }
        logs["api"] = api.log_text

        def submit(key: str, *extra: str) -> None:
            done = procs.run("submit", "pipeline", "--input", '{"text": "x"}', "--key", key, *extra)
            assert done.returncode == 0, done.stdout + done.stderr

        def completed(key: str) -> bool:
            listed = procs.run("runs", "list", "--key", key, "-o", "json").stdout
            return '"state": "completed"' in listed

        submit("before")
        _wait_for(lambda: completed("before"), "run 'before' completed", procs)
        assert _ready(api.base_url) == 200

        _db(owner_database_url, "downgrade", "base", "--yes")
        submit("during", "--via-broker")  # the submitter holds it, unacked
        _wait_for(lambda: _ready(api.base_url) == 503, "/readyz 503", procs)
        _wait_for(
            lambda: all(SAID in log() for log in logs.values()),
            "every role saying it",
            procs,
        )
        said_at = {name: len(log().splitlines()) for name, log in logs.items()}
        # Some seconds of failing: ~30 sweeps, a few scheduler passes, the submitter's retries
        # of the held submission, the callback loop every 0.2 s, /readyz polled.
        quiet_until = time.monotonic() + 6
        while time.monotonic() < quiet_until:
            assert _ready(api.base_url) == 503
            time.sleep(0.5)
        procs.assert_alive()
        for name, log in logs.items():
            text = log()
            assert text.count(SAID) == 1, f"{name}: {text}"
            assert "Traceback" not in text, f"{name}: {text}"
            grown = len(text.splitlines()) - said_at[name]
            # The api logs one access line per /readyz poll: count the others only.
            others = [
                line for line in text.splitlines()[said_at[name] :] if "uvicorn.access" not in line
            ]
            assert len(others) <= 2, f"{name}: {grown} lines since it said it: {others}"
        [line] = [ln for ln in logs["scheduler"]().splitlines() if SAID in ln]
        assert " ERROR " in line
        assert line.endswith(f"{EMPTY}; retrying quietly until then")

        _db(owner_database_url, "upgrade")
        _wait_for(lambda: completed("during"), "the held submission's run completed", procs)
        _wait_for(lambda: _ready(api.base_url) == 200, "/readyz 200", procs)
        _wait_for(
            lambda: all(RESUMED.search(log()) for log in logs.values()),
            "every role resumed",
            procs,
        )
        procs.assert_alive()
        for name, log in logs.items():
            text = log()
            assert (text.count(SAID), len(RESUMED.findall(text))) == (1, 1), f"{name}: {text}"
            assert "Traceback" not in text, f"{name}: {text}"
