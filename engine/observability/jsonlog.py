"""`--log-format json`: one JSON object per log line, with the ids of the work in hand.

The ids come from context variables that `LogContext` (a hook) sets on the agent's worker
thread while it runs a handler; the trace id from the current OpenTelemetry span when tracing
is on (looked up only if OpenTelemetry was already imported by the tracing hooks).
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from sasflow.hooks import Headers, Hooks
from sasflow.messages import Reply, Request

WORK: ContextVar[dict[str, int] | None] = ContextVar("sasflow_log_work", default=None)
"""run_id / step_id / attempt of the step this thread works on, if any."""


class JsonFormatter(logging.Formatter):
    """timestamp (UTC, ISO 8601), level, role, logger, message, pid; run_id, step_id, attempt
    and trace_id/span_id when known; exception when one is logged."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self._role = role

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "role": self._role,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        work = WORK.get()
        if work:
            line.update(work)
        tracing = sys.modules.get("sasflow.observability.tracing")
        if tracing is not None:
            ids = tracing.trace_ids()
            if ids is not None:
                line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class LogContext(Hooks):
    """Names the step an agent's worker thread runs in its log lines."""

    def handler_started(self, request: Request, headers: Headers) -> None:
        WORK.set({"run_id": request.run_id, "step_id": request.step_id, "attempt": request.attempt})

    def handler_finished(
        self, request: Request, reply: Reply | None, seconds: float, breaker: str | None
    ) -> Headers | None:
        WORK.set(None)
        return None
