"""The demo's e-commerce app run as separate processes (see README.md)."""
