"""Schemathesis over every operation of a real `sasflow api` process (PostgreSQL, RabbitMQ):
cases generated from `/openapi.json` (its examples, boundary values, random and invalid data,
and sequences that follow its links), each answer checked against the document. The test
fails on any 5xx, any status the operation does not declare, any body or header that does not
match its schema, and any operation that answers without the token it declares.

The budget is small for CI (at most SASFLOW_FUZZ_EXAMPLES cases per operation and phase, 25
by default: about 25 s on 2 cores, seed SASFLOW_FUZZ_SEED, 1); the figures of a run are
printed, and docs/api.md records them with those of a larger run made by hand:

    SASFLOW_FUZZ_EXAMPLES=1000 SASFLOW_FUZZ_SEED=11 pytest tests/api/test_fuzz.py -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from sasflow.schedules.definition import Schedule
from sasflow.store.db import run_transaction
from sasflow.store.outbox.alerts import Alert, raise_alert
from tests.api.cluster import add_schedule, register_scheduler
from tests.api.server import REPO, ApiServer, make_token, module_api_fixture
from tests.apps import basic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "ignored_auth",
)
"""What the answers are held to: the document (statuses, media types, headers, schemas) and
its security (an operation that declares a token refuses a request without one)."""
EXAMPLES = int(os.environ.get("SASFLOW_FUZZ_EXAMPLES", "25"))
SEED = int(os.environ.get("SASFLOW_FUZZ_SEED", "1"))


api = module_api_fixture()


def _seed(api: ApiServer, module_engine: Engine, token: str) -> None:
    """Something for each resource, so that cases reach more than 404s: runs (one cancelled,
    so it can be resubmitted), an alert, a schedule, a scheduler, a flow limit."""
    with api.client(token) as http:
        ids = [
            http.post("/v1/runs", json={"workflow": "pipeline", "input": {"text": f"t{n}"}}).json()[
                "id"
            ]
            for n in range(3)
        ]
        cancelled = http.post(f"/v1/runs/{ids[0]}/cancel", json={"reason": "seed"})
        assert cancelled.status_code == 200, cancelled.text
        limit = {"agent": "echo", "rate": "100/s", "reason": "seed"}
        assert http.put("/v1/limits/echo-rate", json=limit).status_code == 201
    run_transaction(
        module_engine,
        lambda conn: raise_alert(
            conn, Alert(kind="step_failed", subject="fuzz", message="seeded", run_id=ids[1])
        ),
    )
    add_schedule(module_engine, Schedule("hourly", "pipeline", every=3600), basic.registry)
    register_scheduler(module_engine, "fuzz-scheduler")


def _run_schemathesis(api: ApiServer, token: str, workdir: Path) -> dict[str, Any]:
    report = workdir / "report.json"
    command = [
        str(SCHEMATHESIS),
        "run",
        f"{api.base_url}/openapi.json",
        *("--header", f"Authorization: Bearer {token}"),
        *("--checks", ",".join(CHECKS)),
        *("--max-examples", str(EXAMPLES)),
        *("--seed", str(SEED)),
        *("--workers", "1"),
        *("--request-timeout", "10"),
        *("--generation-database", "none"),
        *("--report", "json", "--report-json-path", str(report)),
        "--no-color",
    ]
    environment = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.api.fuzz_hooks",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(  # its exit status is checked with the report, below
        command,
        check=False,
        cwd=workdir,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (workdir / "schemathesis.txt").write_text(done.stdout + done.stderr)
    assert report.exists(), done.stdout[-5000:] + done.stderr[-5000:]
    result: dict[str, Any] = json.loads(report.read_text())
    result["output"] = done.stdout
    result["returncode"] = done.returncode
    return result


def test_every_operation_answers_as_its_document_says(
    api: ApiServer, module_engine: Engine, tmp_path: Path
) -> None:
    token = make_token(module_engine, "fuzzer", "admin")
    _seed(api, module_engine, token)
    with api.client() as http:
        document = http.get("/openapi.json").json()
    operations = sum(len(methods) for methods in document["paths"].values())

    result = _run_schemathesis(api, token, tmp_path)

    cases = result["test_cases"]
    print(
        f"\nschemathesis {result['schemathesis_version']}, seed {result['seed']}, "
        f"{EXAMPLES} examples: {result['operations']['tested']} of {operations} operations, "
        f"{cases['generated']} cases, {cases['with_failures']} with failures, "
        f"{len(result['errors'])} errors, {result['running_time']:.0f} s"
    )
    tail = result["output"][-8000:]
    assert result["failures"] == [], tail
    assert result["errors"] == [], tail
    assert result["returncode"] == 0, tail
    assert result["operations"]["tested"] == result["operations"]["total"] == operations
    # Fewer than EXAMPLES per operation and phase once an operation's inputs run out (/healthz).
    assert cases["generated"] >= operations * min(EXAMPLES, 10)
    assert "Traceback" not in api.log_text()
