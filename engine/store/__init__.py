"""The state store (PostgreSQL or a SQLite file): the one door to the database.

Its floors:
- this folder, the plumbing: tables (`schema`), connections and error translation (`db`), the
  databases' differences and the engine's `Capabilities` (`dialect`, `sqlite`, `sqltime`,
  `types`), migrations (`migrate`), wake-ups (`notify`, `listen`);
- `runs/`, the engine's transitions: recording runs, claiming, applying replies, advancing and
  compensating runs, the sweep's statements, the events history and its outbox;
- `cluster/`, coordination rows: scheduler registrations, schedules and their owners, the shard
  plan, leases, the agent fleet;
- `operator/`, what operators and the API read and change: transitions, reads, gauges, the
  audit trail, retention, API tokens;
- `outbox/`, what else leaves the system: alerts, HTTP callbacks, the subscription stream;
- `flow/`, flow control: rate and concurrency limits, the fleet bound and breakers held in the
  budgeted claim, and what operators read of them.
"""
