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
    "alert_remind_s": 3600.0,
}
"""The alert settings as `Settings.redacted()` shows them when none is configured."""

LIMIT_DEFAULTS: dict[str, Any] = {
    "max_message_bytes": 1048576,
    "max_json_depth": 64,
    "max_backlog": 10000,
}
"""The message limits and the backlog bound as `Settings.redacted()` shows them when none is
configured."""
RETENTION_DEFAULTS: dict[str, Any] = {
    "retain_completed_days": 30,
    "retain_failed_days": 90,
    "retain_audit_days": 365,
    "retain_dead_letters_days": 14,
    "retain_dead_letters_max": 10_000,
}
"""The retention settings as `Settings.redacted()` shows them when none is configured."""
STREAM_DEFAULTS: dict[str, Any] = {
    "api_stream_heartbeat_s": 15.0,
    "api_stream_resend_s": 30.0,
    "api_stream_away_alert_s": 86400.0,
    "api_stream_expire_s": 604800.0,
}
"""The subscription stream's settings as `Settings.redacted()` shows them by default."""
CONNECTION_DEFAULTS: dict[str, Any] = {
    "db_pool_size": None,
    "db_max_overflow": None,
    "db_pool_timeout": 30.0,
    "db_connect_timeout": 10,
    "db_statement_timeout": 60.0,
    "broker_heartbeat": 30,
    "broker_connection_attempts": 1,
    "broker_retry_delay": 2.0,
    "broker_socket_timeout": 10.0,
    "broker_blocked_connection_timeout": 60.0,
    "broker_ca_file": None,
    "broker_cert_file": None,
    "broker_key_file": None,
}
"""The connection settings as `Settings.redacted()` shows them when none is configured."""
API_DEFAULTS: dict[str, Any] = {
    "api_host": "127.0.0.1",
    "api_port": 8080,
    "api_max_body_bytes": 1048576,
    "api_max_json_depth": 64,
    "api_body_timeout_s": 30.0,
    "api_header_timeout_s": 30.0,
    "api_ssl_certfile": None,
    "api_ssl_keyfile": None,
    "api_callback_give_up_s": 86400,
    "api_callback_max_attempts": 1024,
    "api_callback_backoff_initial_s": 1.0,
    "api_callback_backoff_max_s": 600.0,
    "api_callback_timeout_s": 10.0,
    "api_callback_poll_s": 1.0,
    "api_callbacks": True,
    "pool_give_up_s": 86400,
    "pool_max_looks": 1024,
    "api_callback_secret": None,
    "api_session_secret": None,
}
"""The HTTP API and pool settings as `Settings.redacted()` shows them when none is configured."""
