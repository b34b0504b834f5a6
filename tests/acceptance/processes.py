"""Start sasflow CLI processes as subprocesses, the way an operator runs them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests import services

REPO = Path(__file__).resolve().parents[2]

READY = {"scheduler": "serving namespace", "agent": "consuming", "submitter": "consuming"}
"""What each role logs once it has declared its queues and consumes: the scheduler its replies
queue, an agent its requests, the submitter the submissions."""


class Processes:
    """The `sasflow` processes of one test; all are killed at the end, whatever happens."""

    def __init__(
        self,
        logs: Path,
        *,
        database_url: str,
        namespace: str,
        app: str = "tests.apps.basic",
        broker_url: str | None = None,
    ) -> None:
        self.logs = logs
        self.env = {
            **os.environ,
            "SASFLOW_DATABASE_URL": database_url,
            "SASFLOW_BROKER_URL": broker_url or services.broker_url(),
            "SASFLOW_NAMESPACE": namespace,
            "SASFLOW_APP": app,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
        }
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self._roles: dict[str, str] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "sasflow", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        self.started[name] = process
        self._roles[name] = args[0] if args else ""
        return process

    def wait_ready(self, *names: str, timeout: float = 30) -> None:
        """Wait until each of `names` (schedulers, agents, submitters) logged that it serves:
        its queues are declared and it consumes. Fails early when one exited."""
        deadline = time.monotonic() + timeout
        waiting = list(names)
        while waiting:
            self.assert_alive()
            waiting = [n for n in waiting if READY[self._roles[n]] not in self.log(n)]
            if waiting and time.monotonic() > deadline:
                raise AssertionError(
                    f"not serving after {timeout}s: {waiting}; logs in {self.logs}"
                )
            time.sleep(0.05)

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sasflow", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            check=False,
        )

    def signal(self, name: str, signum: int) -> None:
        self.started[name].send_signal(signum)

    def wait(self, name: str, timeout: float = 30) -> int:
        return self.started[name].wait(timeout)

    def assert_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.started.items() if p.poll() is not None}
        assert not dead, f"processes exited early: {dead}; logs in {self.logs}"

    def assert_alive_except(self, *names: str) -> None:
        dead = {
            n: p.returncode
            for n, p in self.started.items()
            if n not in names and p.poll() is not None
        }
        assert not dead, f"processes exited early: {dead}; logs in {self.logs}"

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.started.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in self.started.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            if process.poll() is None:
                process.kill()
                process.wait(5)


@contextlib.contextmanager
def processes(
    logs: Path, *, database_url: str, namespace: str, broker_url: str | None = None
) -> Iterator[Processes]:
    """The processes of one test, on the shared broker unless `broker_url` names another."""
    procs = Processes(logs, database_url=database_url, namespace=namespace, broker_url=broker_url)
    try:
        yield procs
    finally:
        procs.stop_all()
