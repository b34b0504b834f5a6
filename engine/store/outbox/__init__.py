"""What leaves the system besides status events: alerts (raised and delivered), HTTP callbacks,
and the subscription stream's subscribers and unacknowledged updates."""
