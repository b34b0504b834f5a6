"""The chaos suite: the real sasflow processes under a seeded fault schedule, on throw-away
PostgreSQL and RabbitMQ instances of its own, followed by an invariant check (docs/chaos.md)."""
