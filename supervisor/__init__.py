"""The sasflow supervisor: recovers expired steps, escalates and compensates."""
