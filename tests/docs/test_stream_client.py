"""The stream clients of docs/api-stream.md against a real `sasflow api`: the curl + POSIX
shell one prints every record and acknowledges every update; the Python example prints each
update and resumes its subscriber after a restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from sasflow.store.schema import stream_updates, subscribers
from sasflow.transport.topology import Names
from tests import services
from tests.api.server import REPO, api_server, make_token
from tests.docs.markdown import shell_commands
from tests.stream_feed import feeding

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SCRIPT = "examples/stream/follow.sh"


def _pending(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(stream_updates)).scalar_one())


def test_the_shell_client_follows_the_stream(
    tmp_path: Path, engine: Engine, database_url: str, names: Names
) -> None:
    assert ["sh", SCRIPT] in shell_commands("docs/api-stream.md", "sh")
    with api_server(
        tmp_path,
        database_url=database_url,
        broker_url=services.broker_url(),
        namespace=names.namespace,
        env={"SASFLOW_API_STREAM_HEARTBEAT_S": "0.5"},
    ) as server:
        env = {
            **os.environ,
            "SASFLOW_API_URL": server.base_url,
            "SASFLOW_API_TOKEN": make_token(engine, "shell", "read"),
        }
        errors = tmp_path / "follow.err"
        with errors.open("wb") as stderr:
            client = subprocess.Popen(
                ["sh", SCRIPT],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,  # sh, curl and head: one group to stop
            )
        lines: list[dict[str, object]] = []
        reader = threading.Thread(
            target=lambda: lines.extend(json.loads(line) for line in client.stdout or []),
            daemon=True,
        )
        reader.start()
        try:
            deadline = time.monotonic() + 20
            while not lines and time.monotonic() < deadline:
                time.sleep(0.05)
            assert lines, errors.read_text()
            assert lines[0]["type"] == "SUBSCRIBED"
            with feeding(engine, names) as feed:
                runs = feed.runs(5)
            while time.monotonic() < deadline and (
                sum(r["type"] == "UPDATE" for r in lines) < 5 or _pending(engine)
            ):
                time.sleep(0.05)
            time.sleep(1.0)  # two heartbeats: nothing is re-sent, everything was acknowledged
        finally:
            os.killpg(client.pid, signal.SIGTERM)
            client.wait(10)
            reader.join(5)
            if client.stdout is not None:
                client.stdout.close()
        updates = [r for r in lines if r["type"] == "UPDATE"]
        assert [u["run"] for u in updates] == runs
        assert _pending(engine) == 0
        assert {r["type"] for r in lines} == {"SUBSCRIBED", "UPDATE", "HEARTBEAT"}


def _subscribers(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(subscribers)).scalar_one())


def _until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_python_example_follows_the_stream_and_resumes_after_a_restart(
    tmp_path: Path, engine: Engine, database_url: str, names: Names
) -> None:
    """examples/stream/follow.py prints each update, and a restart resumes its subscriber
    (kept in a file): one subscriber, every update printed once."""
    with (
        api_server(
            tmp_path,
            database_url=database_url,
            broker_url=services.broker_url(),
            namespace=names.namespace,
            env={"SASFLOW_API_STREAM_HEARTBEAT_S": "0.5"},
        ) as server,
        feeding(engine, names) as feed,
    ):
        env = {
            **os.environ,
            "SASFLOW_API_URL": server.base_url,
            "SASFLOW_API_TOKEN": make_token(engine, "example", "read"),
            "SUBSCRIBER_FILE": str(tmp_path / "subscriber"),
            "PYTHONPATH": str(REPO),
        }
        printed: list[str] = []
        for batch in (3, 2):
            example = subprocess.Popen(
                [sys.executable, "-m", "examples.stream.follow", "pipeline"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                # Updates wait in the subscriber's rows until its stream takes them: no need
                # to wait for the restarted example to be connected.
                _until((tmp_path / "subscriber").exists, "the subscriber file")
                runs = feed.runs(batch)
                _until(lambda: _pending(engine) == 0, "every update acknowledged")
            finally:
                example.send_signal(signal.SIGTERM)
                out, _ = example.communicate(timeout=20)
            printed += out.splitlines()
            assert out.splitlines() == [f"run {run}: None -> pending" for run in runs]
        assert len(printed) == 5
        assert _subscribers(engine) == 1
