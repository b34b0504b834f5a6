"""The retention of what grows besides runs, as settings and options: defaults, 0 for forever,
an alert before an expiry, and what the supervisor's metrics count of it."""

from __future__ import annotations

import os

import pydantic
import pytest

from sasflow.errors import InvalidActionError
from sasflow.observability.exposition import new_registry
from sasflow.observability.metrics import SupervisorMetrics
from sasflow.ops.retention import DAY, GrowthRetention
from sasflow.settings import Settings
from sasflow.store.runs.sweeps import SweepReport


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SASFLOW_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_the_defaults_keep_everything_bounded() -> None:
    growth = GrowthRetention.from_settings(Settings())
    assert growth == GrowthRetention(
        audit_keep_s=365 * DAY,
        subscriber_alert_s=DAY,
        subscriber_expire_s=7 * DAY,
        dead_letters_keep_s=14 * DAY,
        dead_letters_max=10_000,
    )


@pytest.mark.usefixtures("clean_env")
def test_zero_keeps_forever() -> None:
    settings = Settings(
        retain_audit_days=0,
        retain_dead_letters_days=0,
        retain_dead_letters_max=0,
        api_stream_away_alert_s=0,
        api_stream_expire_s=0,
    )
    assert GrowthRetention.from_settings(settings) == GrowthRetention()
    alert_only = Settings(api_stream_expire_s=0)
    assert GrowthRetention.from_settings(alert_only).subscriber_alert_s == DAY
    assert GrowthRetention.from_settings(alert_only).subscriber_expire_s is None


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    ("alert", "expire", "says"),
    [
        (0, 3600, "must be above 0 and below SASFLOW_API_STREAM_EXPIRE_S"),
        (7200, 3600, "must be above 0 and below SASFLOW_API_STREAM_EXPIRE_S"),
        (3600, 3600, "must be above 0 and below SASFLOW_API_STREAM_EXPIRE_S"),
        (30, 3600, "must be at least 60 seconds"),
    ],
)
def test_a_subscriber_is_alerted_before_it_expires(alert: float, expire: float, says: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=says):
        Settings(api_stream_away_alert_s=alert, api_stream_expire_s=expire)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"subscriber_expire_s": 60.0}, "alerted before it expires"),
        ({"subscriber_alert_s": 60.0, "subscriber_expire_s": 60.0}, "alerted before it expires"),
        ({"audit_keep_s": 0.0}, "audit_keep_s must be above 0"),
        ({"dead_letters_max": 0}, "dead_letters_max must be at least 1"),
    ],
)
def test_the_options_refuse_what_the_settings_refuse(fields: dict[str, float], says: str) -> None:
    with pytest.raises(InvalidActionError, match=says):
        GrowthRetention(**fields)  # type: ignore[arg-type]


def test_the_supervisor_counts_what_retention_removed_by_kind() -> None:
    registry = new_registry()
    hooks = SupervisorMetrics(registry)
    hooks.sweep_finished(
        SweepReport(
            pruned=4,
            inbound_pruned=2,
            audit_pruned=3,
            subscribers_expired=1,
            updates_deleted=50,
            dead_letters_expired=7,
        )
    )
    hooks.sweep_finished(SweepReport(dead_letters_expired=2))
    hooks.sweep_finished(None)  # standby: nothing counted
    removed = {
        what: registry.get_sample_value("sasflow_retention_removed_total", {"what": what})
        for what in (
            "runs",
            "inbound_events",
            "audit_records",
            "subscribers",
            "stream_updates",
            "dead_letters",
        )
    }
    assert removed == {
        "runs": 4,
        "inbound_events": 2,
        "audit_records": 3,
        "subscribers": 1,
        "stream_updates": 50,
        "dead_letters": 9,
    }
