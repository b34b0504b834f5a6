"""A local cluster for tests: three RabbitMQ nodes and a PostgreSQL primary with a synchronous
standby on this machine (`scripts/cluster`, `python -m tests.cluster`), and the cluster tier
that runs on it."""
