"""The tutorial's app (docs/tutorial.md)."""
