"""Start a real `sasflow api` process (uvicorn on a free port) for a test, and talk to it."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from sasflow.ops import tokens
from sasflow.store.db import run_transaction
from sasflow.transport.topology import Names
from tests import services

REPO = Path(__file__).resolve().parents[2]
SECRET = "test-callback-key-0123"  # noqa: S105 - the test servers' callback key


def free_port() -> int:
    """A port nobody listens on now (the OS's choice of an ephemeral one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ApiServer:
    base_url: str
    process: subprocess.Popen[bytes]
    log: Path
    verify: ssl.SSLContext | bool = True
    """What the server's certificate is checked against (HTTPS)."""

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30, verify=self.verify)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def api_server(
    logs: Path,
    *,
    database_url: str,
    broker_url: str,
    namespace: str,
    app: str = "tests.apps.basic",
    env: dict[str, str | None] | None = None,
    name: str = "api",
    tls: tuple[Path, Path] | None = None,
) -> Iterator[ApiServer]:
    """`sasflow api` on a free port, ready (/healthz answers) when the block starts; stopped
    with SIGTERM (killed after 15 s) when it ends. `tls`: (certificate, key) to serve HTTPS."""
    port = free_port()
    log = logs / f"{name}.log"
    environment = {
        **os.environ,
        "SASFLOW_DATABASE_URL": database_url,
        "SASFLOW_BROKER_URL": broker_url,
        "SASFLOW_NAMESPACE": namespace,
        "SASFLOW_APP": app,
        "SASFLOW_API_CALLBACK_SECRET": SECRET,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    for variable, value in (env or {}).items():  # None: unset
        environment.pop(variable, None)
        if value is not None:
            environment[variable] = value
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                *("-m", "sasflow", "api", "--port", str(port)),
                *(("--ssl-certfile", str(tls[0]), "--ssl-keyfile", str(tls[1])) if tls else ()),
            ],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    scheme = "https" if tls else "http"
    verify = ssl.create_default_context(cafile=str(tls[0])) if tls else True
    server = ApiServer(f"{scheme}://127.0.0.1:{port}", process, log, verify)
    try:
        _wait_until_up(server)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@contextlib.contextmanager
def module_api_server(
    tmp_path_factory: pytest.TempPathFactory,
    database_url: str,
    broker_namespaces: set[str],
    *,
    env: dict[str, str | None] | None = None,
) -> Iterator[ApiServer]:
    """`api_server` for a module's shared fixture: its logs in a temporary folder of their own
    and a namespace of its own, left to the session's sweep (`broker_namespaces`)."""
    names = Names(services.unique("sftest"))
    broker_namespaces.add(names.namespace)
    with api_server(
        tmp_path_factory.mktemp("api"),
        database_url=database_url,
        broker_url=services.broker_url(),
        namespace=names.namespace,
        env=env,
    ) as server:
        yield server


def module_api_fixture(env: dict[str, str | None] | None = None) -> object:
    """The module-scoped `api` fixture most API test modules share (`api =
    module_api_fixture()`): one `sasflow api` for the module, on `module_database`, with `env`."""

    @pytest.fixture(scope="module")
    def api(
        tmp_path_factory: pytest.TempPathFactory, module_database: str, broker_namespaces: set[str]
    ) -> Iterator[ApiServer]:
        with module_api_server(
            tmp_path_factory, module_database, broker_namespaces, env=env
        ) as server:
            yield server

    return api


def _wait_until_up(server: ApiServer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"sasflow api exited: {server.log_text()}")
        with contextlib.suppress(httpx.TransportError):
            answer = httpx.get(f"{server.base_url}/healthz", timeout=2, verify=server.verify)
            if answer.status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"sasflow api not up after {timeout}s: {server.log_text()}")


def make_token(engine: Engine, name: str, *scopes: str) -> str:
    """A new token's secret (created as `sasflow tokens create` would)."""
    return run_transaction(
        engine, lambda conn: tokens.create(conn, name=name, scopes=scopes, actor="test").secret
    )
