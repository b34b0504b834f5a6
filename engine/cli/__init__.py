"""The `sasflow` command line."""
