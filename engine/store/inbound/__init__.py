"""Inbound events for event waits (`Step.wait_for`): stored first (`ingest`), then matched both
ways (`match`): an event that arrives before its wait opens waits in `inbound_events` until the
wait opens or its retention ends; a wait that opens takes the oldest stored event that matches.
"""
