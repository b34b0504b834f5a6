"""docs/api.md's curl session, run line by line against a live `sasflow api` (the embedded
default: a SQLite file) with the quickstart app, as a reader would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sqlalchemy import Engine

from sasflow.states import RunState
from sasflow.store import migrate
from sasflow.store.db import make_engine
from tests.api.server import api_server, make_token
from tests.docs.markdown import REPO, SHELL_BLOCK, shell_commands


def _curl_lines() -> list[str]:
    """The page's curl lines as written (its shell blocks' lines that start with curl)."""
    text = (REPO / "docs/api.md").read_text(encoding="utf-8")
    return [
        line.strip()
        for block in SHELL_BLOCK.finditer(text)
        for line in block["body"].splitlines()
        if line.strip().startswith("curl ")
    ]


def _engine(url: str) -> Engine:
    engine = make_engine(url, pool_size=1)
    migrate.upgrade(engine)
    return engine


def test_the_curl_session_of_the_api_page(tmp_path: Path) -> None:
    """Submit (201), read, list, cancel, and the 401 without a token, as the page says."""
    lines = _curl_lines()
    assert len(lines) == len(shell_commands("docs/api.md", "curl")) == 5
    url = f"sqlite:///{tmp_path / 'api.db'}"
    engine = _engine(url)
    try:
        token = make_token(engine, "shop", "submit", "read", "operate")
    finally:
        engine.dispose()
    with api_server(
        tmp_path,
        database_url=url,
        broker_url="memory://",
        namespace="doc",
        app="examples.quickstart",
    ) as api:
        env = {**os.environ, "SASFLOW_API": api.base_url, "TOKEN": token}
        answers = []
        for line in lines:
            done = subprocess.run(
                ["bash", "-c", line],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=REPO,
            )
            answers.append(json.loads(done.stdout))
    submitted, shown, listed, cancelled, anonymous = answers
    assert (submitted["id"], submitted["created"], submitted["run"]["priority"]) == (1, True, 5)
    assert shown["run"]["business_key"] == "order-1042"
    assert [r["id"] for r in listed["runs"]] == [1]
    assert cancelled["state"] == RunState.CANCELLED
    assert anonymous["error"] == "unauthorized"
