"""Operator services: the functions behind the CLI (and a future HTTP API and UI)."""
