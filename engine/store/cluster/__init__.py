"""Coordination rows, each with a lease on the database clock: scheduler registrations,
schedules and their owners, the shard plan, generic leases with a fencing token, and the agent
fleet's instances."""
