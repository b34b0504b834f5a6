"""What operators and the HTTP API read and change: operator transitions (resubmit, cancel),
reads of runs and steps (`inspect`), gauges, the audit trail, retention, API tokens."""
