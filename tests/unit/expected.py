"""Expected values shared by several unit tests."""

from __future__ import annotations

from typing import Any

ALERT_DEFAULTS: dict[str, Any] = {
    "alert_webhook_url": None,
    "alert_smtp_host": None,
    "alert_smtp_port": 25,
    "alert_smtp_username": None,
    "alert_smtp_password": None,
    "alert_smtp_starttls": False,
    "alert_email_from": None,
    "alert_email_to": [],
    "alert_exchange": True,
}
"""The alert settings as `Settings.redacted()` shows them when none is configured."""

LIMIT_DEFAULTS: dict[str, Any] = {
    "max_message_bytes": 1048576,
    "max_json_depth": 64,
}
"""The message limits as `Settings.redacted()` shows them when none is configured."""
RETENTION_DEFAULTS: dict[str, Any] = {
    "retain_completed_days": 30,
    "retain_failed_days": 90,
}
"""The retention settings as `Settings.redacted()` shows them when none is configured."""
