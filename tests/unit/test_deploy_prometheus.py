"""deploy/prometheus: the scrape config, the alert rules and the Grafana dashboard load, and every
metric they name is one the roles export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from sasflow.observability import exposition, metrics
from sasflow.store.operator.gauges import StateCounts

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
ALERTS = {
    "SasflowStepsExpiring",
    "SasflowBreakerOpen",
    "SasflowAgentWedged",
    "SasflowDeadLettersGrowing",
    "SasflowNoSchedulerAlive",
    "SasflowSupervisorLeaseNotRenewed",
}
PROMETHEUS_OWN = {"up"}
DURATION = re.compile(r"^\d+[smhd]$")


def _load_yaml(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _load_yaml("sasflow-rules.yml")["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> Iterator[str]:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield target["expr"]


def exported_names() -> set[str]:
    """Every series name the roles and the API expose (counters with `_total`, histograms with
    `_bucket`, `_count` and `_sum`, info with `_info`)."""
    registries = [metrics.ApiMetrics(CollectorRegistry()).registry]
    for role, make in metrics.ROLE_METRICS.items():
        registries.append(CollectorRegistry())
        make(registries[-1])
        exposition.build_info(registries[-1], role, "0001")
    registries[-1].register(  # the supervisor's (last) registry holds its state gauges
        metrics.StateGauges(lambda: StateCounts({"running": 1}, {"pending": 1}, 1, 10.0))
    )
    names: set[str] = set()
    for each in registries:
        for family in each.collect():
            if family.type == "counter":
                names.add(f"{family.name}_total")
            elif family.type == "histogram":
                names.update(f"{family.name}{s}" for s in ("_bucket", "_count", "_sum"))
            elif family.type == "info":
                names.add(f"{family.name}_info")
            else:
                names.add(family.name)
    return names


def test_the_scrape_config_has_a_job_per_role_and_loads_the_rules() -> None:
    config = _load_yaml("prometheus.yml")
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    roles = ("scheduler", "agent", "submitter", "supervisor", "api")
    assert jobs == {f"sasflow-{role}" for role in roles}
    assert all(job["static_configs"][0]["targets"] for job in config["scrape_configs"])
    assert config["rule_files"] == ["sasflow-rules.yml"]


def test_the_rules_cover_the_alerts_and_are_well_formed() -> None:
    rules = _rules()
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        assert rule["expr"].strip(), rule["alert"]
        assert DURATION.match(rule.get("for", "0s")), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"], rule["alert"]


def test_every_metric_the_rules_and_the_dashboard_name_is_exported() -> None:
    named = set()
    for expr in [rule["expr"] for rule in _rules()] + list(_dashboard_exprs()):
        named.update(re.findall(r"\b(sasflow_[a-z_]+|up)\b(?=\s*[{\[)]|\s*$|\s*[=<>])", expr))
    assert named, "no metric found: the pattern is broken"
    unknown = named - exported_names() - PROMETHEUS_OWN
    assert unknown == set()


def test_the_dashboard_has_unique_panel_ids_and_a_prometheus_datasource() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["templating"]["list"][0]["query"] == "prometheus"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_config_and_the_rules() -> None:
    promtool = shutil.which("promtool") or "promtool"
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "sasflow-rules.yml"]):
        done = subprocess.run(
            [promtool, *args], cwd=DEPLOY, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
