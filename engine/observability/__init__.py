"""Metrics, traces and structured logs, attached to the roles through `sasflow.hooks`.

Each concern is optional: `metrics` needs the `sasflow[metrics]` extra (prometheus-client),
`tracing` the `sasflow[otel]` extra (OpenTelemetry); neither is imported unless it is on.
"""
