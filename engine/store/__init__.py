"""The state store (PostgreSQL or a SQLite file): schema, connections, the engine's statements."""
