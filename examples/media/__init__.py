"""A media job as a fan-out/fan-in DAG (see README.md)."""
