"""The engine's transitions of runs and steps: record (`submit`, `submit_many`, `step_rows`),
claim, apply replies, advance (`decide`, `records`, `advance`, `compensation`), the sweep's
statements (`sweeps`), the events history and its outbox (`events`), and the hot statements
they share (`queries`, `advance_queries`)."""
