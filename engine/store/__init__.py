"""The PostgreSQL state store: schema, connections and the engine's statements."""
