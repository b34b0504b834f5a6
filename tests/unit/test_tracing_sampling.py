"""Tracing follows the sampling decision made at a run's root: an unsampled trace's hops make
no span and pass its context on; a sampled one's make spans of the same trace."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler

from sasflow.hooks import HookChain
from sasflow.messages import Reply, Request
from sasflow.observability.tracing import PROPAGATOR, Tracing, _unsampled, traceparent
from sasflow.transport.topology import Names

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST = Request(
    step_id=5,
    run_id=3,
    attempt=1,
    workflow="w",
    step="s",
    agent="a",
    action="x",
    idempotency_key="k",
    budget_ms=1000,
    complete_by="2026-01-01T00:00:00+00:00",
)
REPLY = Reply(step_id=5, attempt=1, status="ok", output=None)


def _hooks() -> tuple[HookChain, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return HookChain([Tracing(provider, Names("t"))]), exported


def test_an_unsampled_request_makes_no_span_and_its_reply_carries_the_same_context() -> None:
    hooks, exported = _hooks()
    incoming = f"00-{TRACE}-00f067aa0ba902b7-00"
    hooks.handler_started(REQUEST, {"traceparent": incoming})
    hooks.handler_retrying(REQUEST, TimeoutError("slow"), 1)
    headers = hooks.handler_finished(REQUEST, REPLY, 0.01, "closed")
    assert headers == {"traceparent": incoming}
    assert exported.get_finished_spans() == ()


def test_a_sampled_request_makes_the_handler_and_reply_spans_of_its_trace() -> None:
    hooks, exported = _hooks()
    hooks.handler_started(REQUEST, {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    hooks.handler_retrying(REQUEST, TimeoutError("slow"), 1)
    headers = hooks.handler_finished(REQUEST, REPLY, 0.01, "closed")
    spans = {span.name: span for span in exported.get_finished_spans()}
    assert set(spans) == {"process t.agent.a", "publish t.replies"}
    handler, publish = spans["process t.agent.a"], spans["publish t.replies"]
    assert {format(s.context.trace_id, "032x") for s in spans.values() if s.context} == {TRACE}
    assert handler.parent is not None
    assert format(handler.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert publish.parent is not None
    assert handler.context is not None
    assert publish.parent.span_id == handler.context.span_id
    assert [e.name for e in handler.events] == ["retry"]
    assert handler.attributes is not None
    assert handler.attributes["sasflow.breaker.state"] == "closed"
    assert headers is not None
    assert publish.context is not None
    assert headers["traceparent"] == f"00-{TRACE}-{publish.context.span_id:016x}-01"


@pytest.mark.parametrize("sampler", [ALWAYS_ON, ALWAYS_OFF], ids=["sampled", "unsampled"])
def test_a_root_spans_traceparent_is_what_the_propagator_writes(sampler: Sampler) -> None:
    tracer = TracerProvider(sampler=sampler).get_tracer("t")
    span = tracer.start_span("run w")
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    assert carrier == {"traceparent": traceparent(span)}
    assert _unsampled(traceparent(span)) is (sampler is ALWAYS_OFF)
