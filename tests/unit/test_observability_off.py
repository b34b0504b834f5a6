"""Observability off costs nothing: no optional library is imported, the roles get no hooks;
and the JSON log lines carry what they promise."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from sasflow.errors import ConfigurationError
from sasflow.hooks import HookChain
from sasflow.messages import Request
from sasflow.observability.build import role_hooks
from sasflow.observability.jsonlog import JsonFormatter, LogContext
from sasflow.settings import Settings


def test_the_cli_and_the_roles_load_no_metrics_or_tracing_library_when_off() -> None:
    code = (
        "import sys\n"
        "from sasflow.cli import context, roles, supervisor\n"
        "from sasflow.observability.build import role_hooks\n"
        "from sasflow.settings import Settings\n"
        "for role in ('scheduler', 'agent', 'submitter', 'supervisor'):\n"
        "    assert role_hooks(Settings(), role).hooks == ()\n"
        "heavy = ('prometheus_client', 'opentelemetry')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_port_in_use_is_a_configuration_error() -> None:
    first = role_hooks(Settings(metrics_port=0), "scheduler")
    try:
        server = first.hooks[-1]
        port = server.port  # type: ignore[attr-defined]
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            role_hooks(Settings(metrics_port=port), "agent")
    finally:
        first.close()


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("sasflow.test", logging.INFO, __file__, 1, message, None, None)


def test_a_json_line_names_the_role_and_the_step_being_handled() -> None:
    formatter = JsonFormatter("agent")
    request = Request(
        step_id=5,
        run_id=3,
        attempt=2,
        workflow="w",
        step="s",
        agent="a",
        action="x",
        idempotency_key="k",
        budget_ms=1000,
        complete_by="2026-01-01T00:00:00+00:00",
    )
    hooks = HookChain([LogContext()])
    hooks.handler_started(request, {})
    inside = json.loads(formatter.format(_record("working")))
    hooks.handler_finished(request, None, 0.1, None)
    after = json.loads(formatter.format(_record("done")))
    assert {k: inside[k] for k in ("level", "role", "message", "run_id", "step_id", "attempt")} == {
        "level": "INFO",
        "role": "agent",
        "message": "working",
        "run_id": 3,
        "step_id": 5,
        "attempt": 2,
    }
    assert inside["timestamp"].endswith("+00:00")
    assert "run_id" not in after
