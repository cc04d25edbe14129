"""The chart ships the dashboards and alert rules it holds, behind flags.

Goal: with metrics.dashboards.enabled every Grafana dashboard in
helm/oncelog/dashboards/*.json becomes its own ConfigMap carrying the
sidecar's label, with the file's JSON unchanged; with
metrics.prometheusRule.enabled every rule file helm/oncelog/alerts/*.rules.yaml
becomes a PrometheusRule whose spec.groups are the file's groups; the
ServiceMonitor scrapes the metrics port of exactly the three kinds of pod;
with the flags off (the default) none of these objects exist.

Method: the chart as it is (so every file present is checked, however many
land later) and a copy of the chart with dashboards and rules made up by the
test (so the templates are exercised even while the folders are empty), both
rendered with helm-python-sdk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART_DIR,
    COMPONENT_LABEL,
    RELEASE,
    Rendered,
    deep_merge,
    render,
    validation_errors,
)
from tests.helm.variants import METRICS_ON

DASHBOARD_LABEL = ("grafana_dashboard", "1")


def _dashboards(rendered: Rendered) -> dict[str, Any]:
    """Source path -> the dashboard JSON its ConfigMap carries."""
    shipped = {}
    for config_map in rendered.of_kind("ConfigMap"):
        source = config_map["metadata"].get("annotations", {}).get("oncelog.io/source", "")
        if not source.startswith("dashboards/"):
            continue
        (key, text), = config_map["data"].items()
        assert key == Path(source).name
        shipped[source] = json.loads(text)
    return shipped


def _rule_groups(rendered: Rendered) -> dict[str, Any]:
    """Source path -> the spec.groups of its PrometheusRule."""
    return {
        rule["metadata"]["annotations"]["oncelog.io/source"]: rule["spec"]["groups"]
        for rule in rendered.of_kind("PrometheusRule")
    }


def _check_shipped(chart_dir: Path, rendered: Rendered) -> None:
    dashboards = sorted(chart_dir.glob("dashboards/*.json"))
    shipped = _dashboards(rendered)
    assert sorted(shipped) == [f"dashboards/{p.name}" for p in dashboards]
    for path in dashboards:
        assert shipped[f"dashboards/{path.name}"] == json.loads(path.read_text())
    for config_map in rendered.of_kind("ConfigMap"):
        if "oncelog.io/source" in config_map["metadata"].get("annotations", {}):
            labels = config_map["metadata"]["labels"]
            assert labels[DASHBOARD_LABEL[0]] == DASHBOARD_LABEL[1]
    rule_files = sorted(chart_dir.glob("alerts/*.rules.yaml"))
    groups = _rule_groups(rendered)
    assert sorted(groups) == [f"alerts/{p.name}" for p in rule_files]
    for path in rule_files:
        assert groups[f"alerts/{path.name}"] == yaml.safe_load(path.read_text())["groups"]
        names = [g["name"] for g in groups[f"alerts/{path.name}"]]
        assert len(names) == len(set(names)), f"{path.name}: duplicate group names"


def test_every_dashboard_and_rule_file_of_the_chart_is_shipped() -> None:
    rendered = render(METRICS_ON)
    _check_shipped(CHART_DIR, rendered)
    assert [e for obj in rendered.objects for e in validation_errors(obj)] == []


@pytest.fixture
def chart_with_files(tmp_path: Path) -> Path:
    """A copy of the chart with two dashboards and two rule files of its own
    (and a promtool test file, which is not a rule file)."""
    chart = tmp_path / "oncelog"
    shutil.copytree(CHART_DIR, chart)
    for folder in ("dashboards", "alerts"):
        shutil.rmtree(chart / folder, ignore_errors=True)
    (chart / "alerts" / "tests").mkdir(parents=True)
    (chart / "dashboards").mkdir()
    for name, title in (("overview.json", "Overview"), ("Consumer_Groups.json", "Groups")):
        dashboard = {
            "title": f"oncelog {title}",
            "uid": f"oncelog-{title.lower()}",
            "templating": {"list": [{"name": "datasource", "type": "datasource",
                                     "query": "prometheus"}]},
            # Text that must survive the trip through YAML untouched.
            "panels": [{"type": "timeseries", "title": "rate: \"quoted\" {{braces}}\t#x",
                        "targets": [{"expr": 'sum(rate(oncelog_rpc_requests_total{job=~"$job"}'
                                             "[$__rate_interval]))"}]}],
        }
        (chart / "dashboards" / name).write_text(json.dumps(dashboard, indent=2) + "\n")
    rules = {
        "groups": [
            {"name": "oncelog.transactions", "rules": [
                {"alert": "OncelogHangingTransaction",
                 "expr": "max(oncelog_open_transaction_age_seconds) > 900",
                 "for": "5m", "labels": {"severity": "critical"},
                 "annotations": {"summary": "a transaction is open for {{ $value }}s"}},
                {"record": "oncelog:produce_records:rate5m",
                 "expr": "sum(rate(oncelog_produce_records_total[5m]))"},
            ]},
        ]
    }
    (chart / "alerts" / "oncelog.rules.yaml").write_text(yaml.safe_dump(rules))
    extra = {"groups": [{"name": "oncelog.extra", "interval": "30s", "rules": [
        {"alert": "OncelogDown", "expr": "up == 0", "for": "1m"}]}]}
    (chart / "alerts" / "extra.rules.yaml").write_text(yaml.safe_dump(extra))
    (chart / "alerts" / "tests" / "oncelog_test.yaml").write_text(
        yaml.safe_dump({"rule_files": ["../oncelog.rules.yaml"], "tests": []}))
    return chart


def test_any_number_of_dashboards_and_rule_files_is_shipped(chart_with_files: Path) -> None:
    rendered = render(METRICS_ON, chart_dir=chart_with_files)
    _check_shipped(chart_with_files, rendered)
    assert len(_dashboards(rendered)) == 2
    assert len(_rule_groups(rendered)) == 2
    names = sorted(o["metadata"]["name"] for o in rendered.of_kind("PrometheusRule"))
    # oncelog.rules.yaml, the chart's own, is named after the release alone.
    assert names == [f"{RELEASE}-oncelog", f"{RELEASE}-oncelog-extra"]
    dashboard_maps = sorted(
        o["metadata"]["name"] for o in rendered.of_kind("ConfigMap")
        if o["metadata"]["name"].startswith(f"{RELEASE}-oncelog-dashboard-")
    )
    assert dashboard_maps == [f"{RELEASE}-oncelog-dashboard-consumer-groups",
                              f"{RELEASE}-oncelog-dashboard-overview"]
    for config_map in rendered.of_kind("ConfigMap"):
        if config_map["metadata"]["name"] in dashboard_maps:
            assert config_map["metadata"]["annotations"]["grafana_folder"] == "oncelog"
    for rule in rendered.of_kind("PrometheusRule"):
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert [e for obj in rendered.objects for e in validation_errors(obj)] == []


def test_the_sidecar_label_and_namespace_are_configurable(chart_with_files: Path) -> None:
    values = deep_merge(METRICS_ON, {"metrics": {"dashboards": {
        "labelName": "example.com/dashboard", "labelValue": "oncelog", "namespace": "monitoring",
    }}})
    rendered = render(values, chart_dir=chart_with_files)
    maps = [o for o in rendered.of_kind("ConfigMap") if "-dashboard-" in o["metadata"]["name"]]
    assert len(maps) == 2
    for config_map in maps:
        assert config_map["metadata"]["labels"]["example.com/dashboard"] == "oncelog"
        assert "grafana_dashboard" not in config_map["metadata"]["labels"]
        assert config_map["metadata"]["namespace"] == "monitoring"


def test_a_rule_file_without_groups_is_refused(chart_with_files: Path) -> None:
    (chart_with_files / "alerts" / "broken.rules.yaml").write_text("- alert: NotAGroup\n")
    with pytest.raises(Exception, match="broken.rules.yaml"):
        render(METRICS_ON, chart_dir=chart_with_files)


def test_monitoring_objects_are_off_by_default(chart_with_files: Path) -> None:
    rendered = render(chart_dir=chart_with_files)
    assert rendered.of_kind("ServiceMonitor") == []
    assert rendered.of_kind("PrometheusRule") == []
    assert _dashboards(rendered) == {}


def test_metrics_off_removes_the_port_and_every_monitoring_object(
    chart_with_files: Path,
) -> None:
    rendered = render({"metrics": {"enabled": False}}, chart_dir=chart_with_files)
    for service in rendered.of_kind("Service"):
        if service["metadata"]["labels"][COMPONENT_LABEL] == "etcd":
            continue   # etcd's /health, on its metrics port, is what its probes ask
        assert [p["name"] for p in service["spec"]["ports"]] == ["grpc"]
    assert rendered.one("ConfigMap", f"{RELEASE}-oncelog-cluster")["data"][
        "ONCELOG_METRICS_PORT"] == "0"
    assert rendered.of_kind("ServiceMonitor") == []


def test_service_monitor_scrapes_the_metrics_port_of_every_kind_of_pod() -> None:
    rendered = render(METRICS_ON)
    (monitor,) = rendered.of_kind("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]
    job_label = monitor["spec"]["jobLabel"]

    def matches(labels: dict[str, str]) -> bool:
        if not selector["matchLabels"].items() <= labels.items():
            return False
        return all(e["operator"] == "Exists" and e["key"] in labels
                   for e in selector["matchExpressions"])

    scraped = {s["metadata"]["labels"][job_label] for s in rendered.of_kind("Service")
               if matches(s["metadata"]["labels"])}
    # The job label names the service with an "oncelog-" prefix: the alert
    # rules select jobs containing "oncelog" (docs/metrics.md), and the
    # monitoring test scrapes a local cluster under the same names.
    assert scraped == {"oncelog-partition-store", "oncelog-coordinator",
                       "oncelog-group-coordinator"}
    for service in rendered.of_kind("Service"):
        if matches(service["metadata"]["labels"]):
            assert "metrics" in [p["name"] for p in service["spec"]["ports"]]


def test_service_monitor_without_metrics_is_refused() -> None:
    values = deep_merge(METRICS_ON, {"metrics": {"enabled": False}})
    with pytest.raises(Exception, match="metrics.serviceMonitor.enabled needs metrics.enabled"):
        render(values)
