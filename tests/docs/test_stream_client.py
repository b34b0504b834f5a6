"""The non-Python stream client of docs/api-stream.md (curl and a POSIX shell) against a real
`sasflow api`: it prints every record and acknowledges every update."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from sasflow.store.schema import stream_updates
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
