"""Tests that the documentation's commands and references are true."""
