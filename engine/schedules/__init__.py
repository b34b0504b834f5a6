"""Recurring schedules: their definition, their ticks, and firing them (docs/schedules.md)."""
