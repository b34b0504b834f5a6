"""The operator console under /ui: server-rendered pages over the same service functions
(`sasflow.ops`) as the CLI and the REST API (docs/console.md)."""
