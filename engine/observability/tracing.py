"""OpenTelemetry traces of a run across processes and AMQP hops, as hooks (`sasflow[otel]`).

The W3C trace context travels in AMQP headers (`traceparent`, `tracestate`) and is stored with
the run (`runs.trace_parent`), so every span of a run joins one trace whichever process makes
it: the submitter's `process <ns>.submit` span (or, for a run submitted straight into the
database, a `run <workflow>` span made at its first claim) is the root; each dispatch (claim
and request publish), agent handler, reply publish, reply apply, supervisor expiry and the
run's completion hang below it. Span names and attributes follow the OpenTelemetry messaging
semantic conventions. The sampler decides once, at the root; an unsampled run's hops only pass
its context on. This module is imported only when tracing is on.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sasflow.hooks import Headers, Hooks
from sasflow.states import ReplyStatus
from sasflow.store.runs import traces

if TYPE_CHECKING:
    from sasflow.commands import FinishedRun
    from sasflow.messages import Reply, Request
    from sasflow.store.db import Connection
    from sasflow.store.runs.apply import ApplyReport
    from sasflow.store.runs.claim import ClaimedStep
    from sasflow.transport.base import Delivery
    from sasflow.transport.topology import Names

PROPAGATOR = TraceContextTextMapPropagator()
REMEMBERED_RUNS = 10_000
"""Runs whose trace context a scheduler or supervisor keeps in memory (about 1 MB)."""
SYSTEM = {"messaging.system": "rabbitmq"}


class JsonLinesExporter(SpanExporter):
    """Writes each finished span as one JSON object per line (OTLP-free, for files and tests)."""

    def __init__(self, path: str | Path) -> None:
        self._file = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - closed in shutdown
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span), default=str) + "\n" for span in spans)
        with self._lock:
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One span as a JSON object: the fields and spelling of the SDK's `to_json` (ids as
    0x-prefixed hex), times in Unix nanoseconds, and only the resource's service name; about
    a third of `to_json`'s cost, which matters on a role's hot path."""
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "context": {
            "trace_id": f"0x{context.trace_id:032x}" if context else None,
            "span_id": f"0x{context.span_id:016x}" if context else None,
        },
        "kind": str(span.kind),
        "parent_id": f"0x{parent.span_id:016x}" if parent is not None else None,
        "start_time": span.start_time,
        "end_time": span.end_time,
        "status": {"status_code": span.status.status_code.name},
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "timestamp": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
        "resource": {"attributes": {"service.name": span.resource.attributes.get("service.name")}},
    }


def file_provider(service: str, path: str | Path) -> TracerProvider:
    """A provider that batches spans of `service` into the JSON-lines file `path`."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # A queue deep enough for a scheduler's bursts (the default 2048 drops spans beyond it).
    provider.add_span_processor(
        BatchSpanProcessor(
            JsonLinesExporter(path), max_queue_size=32768, max_export_batch_size=2048
        )
    )
    return provider


def _extract(headers: Mapping[str, Any] | None) -> Context | None:
    if not headers or "traceparent" not in headers:
        return None
    carrier = {k: _text(v) for k, v in headers.items() if k in ("traceparent", "tracestate")}
    return PROPAGATOR.extract(carrier)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _unsampled(traceparent: str | None) -> bool:
    """True for a W3C traceparent whose sampled flag is off: its hops make no span at all and
    only pass the context on (the sampler decided at the run's root)."""
    if not traceparent or len(traceparent) < 55:
        return False
    try:
        return not int(traceparent[-2:], 16) & 1
    except ValueError:
        return False


def traceparent(span: Span) -> str:
    """The W3C `traceparent` of `span`, formatted from its context: what the propagator would
    write (a root span made here has no `tracestate`) without the context objects it builds,
    a few microseconds per run on the claim path."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _inject(span: Span) -> dict[str, str]:
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def _ids(run_id: int, step_id: int | None = None, attempt: int | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"sasflow.run_id": run_id}
    if step_id is not None:
        found["sasflow.step_id"] = step_id
    if attempt is not None:
        found["sasflow.attempt"] = attempt
    return found


class Tracing(Hooks):
    """Spans for every hop of a run. `owns_provider`: shut the provider down on `close()`."""

    def __init__(
        self, provider: trace.TracerProvider, names: Names, *, owns_provider: bool = True
    ) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("sasflow")
        self._names = names
        self._owns_provider = owns_provider
        self._claims: dict[int, tuple[str | None, int, int]] = {}
        """Step id -> (its run's trace, claim start, claim commit), for the dispatch span."""
        # run id -> traceparent of the runs seen lately (loop thread only): a run's later
        # claims and its completion usually happen in the process that claimed it before.
        self._remembered: OrderedDict[int, str] = OrderedDict()
        self._handling = threading.local()

    # -- submitter --------------------------------------------------------------------------

    def submission_received(self, delivery: Delivery) -> str | None:
        span = self._tracer.start_span(
            f"process {delivery.queue}",
            context=_extract(delivery.headers),
            kind=SpanKind.CONSUMER,
            attributes={
                **SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": delivery.queue,
                "messaging.message.id": delivery.message_id or "",
            },
        )
        span.end()
        return traceparent(span)

    # -- scheduler --------------------------------------------------------------------------

    def _run_parents(self, conn: Connection, workflows: Mapping[int, str]) -> dict[int, str]:
        """The trace of each run: remembered, else stored, else a new root span stored now.

        Root spans are made for every run not remembered and ended (exported) only for the runs
        that had none stored: one UPDATE serves both the question and the answer."""
        found = {r: p for r in workflows if (p := self._remembered.get(r)) is not None}
        roots = {
            run_id: self._tracer.start_span(f"run {workflow}", attributes=_ids(run_id))
            for run_id, workflow in workflows.items()
            if run_id not in found
        }
        if roots:
            proposed = {run_id: traceparent(span) for run_id, span in roots.items()}
            taken = traces.set_missing_trace_parents(conn, proposed)
            for run_id in taken:
                roots[run_id].end()
                found[run_id] = proposed[run_id]
            others = set(roots) - taken
            found.update(
                (r, p) for r, p in traces.trace_parents(conn, others).items() if p is not None
            )
        for run_id, parent in found.items():
            self._remember(run_id, parent)
        return found

    def _remember(self, run_id: int, parent: str) -> None:
        self._remembered[run_id] = parent
        self._remembered.move_to_end(run_id)
        while len(self._remembered) > REMEMBERED_RUNS:
            self._remembered.popitem(last=False)

    def steps_claimed(self, conn: Connection, steps: Sequence[ClaimedStep], seconds: float) -> None:
        self._claims.clear()
        if not steps:
            return
        parents = self._run_parents(conn, {s.run_id: s.workflow for s in steps})
        claimed = time.time_ns()
        started = claimed - int(seconds * 1e9)
        for step in steps:
            self._claims[step.id] = (parents.get(step.run_id), started, claimed)

    def request_headers(self, step: ClaimedStep) -> Headers | None:
        """The dispatch span: from the claim statement's start to the publish, with a
        `claimed` event (one span per step rather than two: the claim is one statement for a
        whole batch, and every span costs the scheduler's loop)."""
        parent, started, claimed = self._claims.pop(step.id, (None, None, None))
        if parent is not None and _unsampled(parent):
            return {"traceparent": parent}
        queue = self._names.agent(step.agent)
        span = self._tracer.start_span(
            f"publish {queue}",
            context=PROPAGATOR.extract({"traceparent": parent}) if parent else None,
            kind=SpanKind.PRODUCER,
            start_time=started,
            attributes={
                **SYSTEM,
                **_ids(step.run_id, step.id, step.attempt),
                "messaging.operation.type": "publish",
                "messaging.destination.name": queue,
                "messaging.rabbitmq.destination.routing_key": queue,
                "messaging.message.conversation_id": f"{step.id}:{step.attempt}",
                "sasflow.step": step.name,
            },
        )
        span.add_event("claimed", timestamp=claimed)
        span.end()
        return _inject(span)

    def replies_applied(
        self, replies: Sequence[tuple[Delivery, Reply]], report: ApplyReport, seconds: float
    ) -> None:
        dropped = {(o.step_id, o.attempt) for o in report.dropped}
        started = time.time_ns() - int(seconds * 1e9)
        for delivery, reply in replies:
            if _unsampled(_text(delivery.headers.get("traceparent", ""))):
                continue
            span = self._tracer.start_span(
                f"process {delivery.queue}",
                context=_extract(delivery.headers),
                kind=SpanKind.CONSUMER,
                start_time=started,
                attributes={
                    **SYSTEM,
                    "messaging.operation.type": "process",
                    "messaging.destination.name": delivery.queue,
                    "messaging.message.conversation_id": delivery.correlation_id or "",
                    "sasflow.step_id": reply.step_id,
                    "sasflow.attempt": reply.attempt,
                    "sasflow.reply.status": reply.status.value,
                    "sasflow.reply.dropped": (reply.step_id, reply.attempt) in dropped,
                },
            )
            span.end()

    def runs_finished(self, conn: Connection, finished: Mapping[int, FinishedRun]) -> None:
        self._internal(
            conn,
            {
                run_id: (f"run {run.state}", {"sasflow.workflow": run.workflow})
                for run_id, run in finished.items()
            },
        )
        for run_id in finished:  # an operator's resubmission reads it back from the run
            self._remembered.pop(run_id, None)

    # -- supervisor -------------------------------------------------------------------------

    def steps_expired(self, conn: Connection, rows: Sequence[Any], reason: str) -> None:
        self._internal(
            conn,
            {
                r.run_id: (
                    f"supervisor {reason}",
                    {
                        "sasflow.step_id": r.id,
                        "sasflow.attempt": r.attempt,
                        "sasflow.step.state": str(r.state),
                    },
                )
                for r in rows
            },
        )

    def _internal(self, conn: Connection, spans: Mapping[int, tuple[str, dict[str, Any]]]) -> None:
        if not spans:
            return
        parents = {r: p for r in spans if (p := self._remembered.get(r)) is not None}
        if len(parents) < len(spans):
            stored = traces.trace_parents(conn, set(spans) - set(parents))
            parents.update((r, p) for r, p in stored.items() if p is not None)
        for run_id, (name, attributes) in spans.items():
            parent = parents.get(run_id)
            if _unsampled(parent):
                continue
            context = PROPAGATOR.extract({"traceparent": parent}) if parent else None
            self._tracer.start_span(
                name, context=context, attributes={**_ids(run_id), **attributes}
            ).end()

    # -- agent (worker threads) -------------------------------------------------------------

    def handler_started(self, request: Request, headers: Headers) -> None:
        incoming = _text(headers.get("traceparent", ""))
        if _unsampled(incoming):
            self._handling.current = None
            self._handling.passing = incoming
            return
        self._handling.passing = None
        queue = self._names.agent(request.agent)
        span = self._tracer.start_span(
            f"process {queue}",
            context=_extract(headers),
            kind=SpanKind.CONSUMER,
            attributes={
                **SYSTEM,
                **_ids(request.run_id, request.step_id, request.attempt),
                "messaging.operation.type": "process",
                "messaging.destination.name": queue,
                "messaging.message.conversation_id": f"{request.step_id}:{request.attempt}",
                "sasflow.workflow": request.workflow,
                "sasflow.step": request.step,
                "sasflow.action": request.action,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        self._handling.current = (span, token)

    def handler_retrying(self, request: Request, error: BaseException, attempt: int) -> None:
        current = getattr(self._handling, "current", None)
        if current is not None:
            current[0].add_event(
                "retry",
                {
                    "exception.type": type(error).__name__,
                    "exception.message": str(error),
                    "sasflow.retry.attempt": attempt,
                },
            )

    def handler_finished(
        self,
        request: Request,
        reply: Reply | None,
        seconds: float,
        breaker: str | None,
    ) -> Headers | None:
        current = getattr(self._handling, "current", None)
        if current is None:
            passing = getattr(self._handling, "passing", None)
            return {"traceparent": passing} if passing and reply is not None else None
        span, token = current
        self._handling.current = None
        if breaker is not None:
            span.set_attribute("sasflow.breaker.state", breaker)
        span.set_attribute("sasflow.reply.status", reply.status.value if reply else "silent")
        if reply is not None and reply.status in (ReplyStatus.ERROR, ReplyStatus.FAILED):
            span.set_status(StatusCode.ERROR, reply.error.message if reply.error else "")
        headers = None
        if reply is not None:
            publish = self._tracer.start_span(
                f"publish {self._names.replies}",
                context=trace.set_span_in_context(span),
                kind=SpanKind.PRODUCER,
                attributes={
                    **SYSTEM,
                    "messaging.operation.type": "publish",
                    "messaging.destination.name": self._names.replies,
                    "messaging.message.conversation_id": f"{request.step_id}:{request.attempt}",
                },
            )
            publish.end()
            headers = _inject(publish)
        span.end()
        otel_context.detach(token)
        return headers

    def close(self) -> None:
        if self._owns_provider and isinstance(self._provider, TracerProvider):
            self._provider.shutdown()


def trace_ids() -> tuple[str, str] | None:
    """The current span's (trace id, span id) in hex, or None (for the JSON log lines)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
