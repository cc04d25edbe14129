"""The dashboards and alert rules of helm/oncelog, checked against a real
Prometheus scraping a real cluster.

Goal: every PromQL expression of every dashboard panel in
helm/oncelog/dashboards/ and of every rule in helm/oncelog/alerts/ is valid
and returns series for a cluster that did real work (an alert expression
that is rightly empty on a healthy cluster must return series in its
unthresholded form — tests/support/monitoring.py); Prometheus loads the rule
files and evaluates every rule without error; what each process exports
passes `promtool check metrics`, and every exported oncelog metric is
documented in docs/metrics.md with its type (and nothing documented is
missing); the workload really produced the events the panels show
(commits, aborts, fencing, a timeout, an open transaction, leader and ISR
changes, a truncation) rather than counters sitting at their initial zero.

Method: one replicated LocalCluster (every service this version ships,
three partition stores and an etcd, as the Helm chart deploys them) and
Debian's `prometheus` scraping every process's /metrics every second on
loopback, with the rule files loaded; the workload of
tests/support/monitoring_workload.py; then, once every target has been
scraped twice after it, each expression through /api/v1/query with
Grafana's variables substituted. Files are discovered from their folders,
so files added later are checked too. Every failure is listed, not just the
first.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oncelog.testing import LocalCluster
from tests.support.monitoring import (
    ALERTS_DIR,
    ROOT,
    check_expression,
    load_dashboards,
    load_rules,
    panel_queries,
    resolve_variables,
    substitute,
)
from tests.support.monitoring_workload import (
    CLUSTER_OPTIONS,
    REPLICATED_TOPIC,
    WorkloadState,
    run_workload,
)
from tests.support.prometheus import PrometheusServer, find_tool

METRICS_DOC = ROOT / "docs" / "metrics.md"


def job_name(kind: str) -> str:
    """The scrape job of a service kind, as the chart's ServiceMonitors name
    them (the alert rules select jobs containing "oncelog")."""
    return "oncelog-" + kind.replace("_", "-")


@dataclass
class Observed:
    cluster: LocalCluster
    prometheus: PrometheusServer
    workload: WorkloadState


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    work = tmp_path_factory.mktemp("monitoring")
    with LocalCluster(work / "cluster", **CLUSTER_OPTIONS) as cluster:
        targets = {
            job_name(kind): [f"127.0.0.1:{p.metrics_port}" for p in procs]
            for kind, procs in cluster.processes.items() if procs
        }
        rule_files = sorted(ALERTS_DIR.glob("*.yaml"))
        with PrometheusServer(work / "prometheus", targets, rule_files=rule_files) as prom:
            prom.wait_targets_up()
            workload = run_workload(cluster)
            try:
                prom.wait_scraped_after(time.time(), scrapes=2)
                yield Observed(cluster, prom, workload)
            finally:
                workload.finish()


def _label_values(prom: PrometheusServer, selector: str | None, label: str) -> list[str]:
    if selector is None:
        return [str(v) for v in prom.api(f"label/{label}/values")]
    series = prom.api("series", **{"match[]": selector})
    return sorted({s[label] for s in series if label in s})


def test_every_dashboard_expression_returns_series(observed: Observed) -> None:
    prom = observed.prometheus
    dashboards = load_dashboards()
    assert dashboards, "no dashboard found in helm/oncelog/dashboards"
    problems: list[str] = []
    checked = 0
    for dashboard in dashboards:
        values, variable_problems = resolve_variables(
            dashboard, lambda selector, label: _label_values(prom, selector, label)
        )
        problems.extend(variable_problems)
        for q in panel_queries(dashboard):
            where = f"{q.dashboard}: panel {q.panel!r} target {q.ref_id}"
            try:
                expr = substitute(q.expr, values)
            except KeyError as exc:
                problems.append(f"{where}: {exc.args[0]} in {q.expr!r}")
                continue
            problem = check_expression(prom.query, expr, thresholded=False)
            checked += 1
            if problem:
                problems.append(f"{where}: {problem}\n    {expr}")
    assert not problems, f"{len(problems)} of {checked} dashboard expressions fail:\n" + \
        "\n".join(problems)


def test_every_alert_expression_is_valid_and_can_fire(observed: Observed) -> None:
    rules = load_rules()
    assert rules, "no rule found in helm/oncelog/alerts"
    problems = []
    for rule in rules:
        problem = check_expression(observed.prometheus.query, rule.expr,
                                   thresholded=rule.is_alert)
        if problem:
            problems.append(f"{rule.file}: {rule.name}: {problem}\n    {rule.expr}")
    assert not problems, "\n".join(problems)


def test_prometheus_evaluates_every_rule_without_error(observed: Observed) -> None:
    prom = observed.prometheus
    expected = {r.name for r in load_rules()}

    def evaluated() -> list[dict[str, object]]:
        return [r for r in prom.rules() if r.get("lastEvaluation", "").startswith("20")]

    give_up_at = time.monotonic() + 30  # a failure guard: rules run every second
    while {r["name"] for r in evaluated()} != expected and time.monotonic() < give_up_at:
        time.sleep(0.2)
    rules = evaluated()
    assert {r["name"] for r in rules} == expected
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []


def _exposition(cluster: LocalCluster) -> dict[str, bytes]:
    out = {}
    for kind, procs in cluster.processes.items():
        for proc in procs:
            url = cluster.metrics_url(kind, proc.node_id)
            with urllib.request.urlopen(url, timeout=30) as resp:
                out[f"{kind}-{proc.node_id}"] = resp.read()
    return out


def test_exported_metrics_pass_promtool_lint(observed: Observed) -> None:
    promtool = find_tool("promtool")
    for process, body in _exposition(observed.cluster).items():
        result = subprocess.run([promtool, "check", "metrics"], input=body,
                                capture_output=True, timeout=60, check=False)
        assert result.returncode == 0, \
            f"{process}: {result.stdout.decode()}{result.stderr.decode()}"


_TYPE_LINE = re.compile(rb"^# TYPE (oncelog_\w+) (\w+)$", re.MULTILINE)
# A row of docs/metrics.md's tables: | `name` | type | labels | unit | meaning |
_DOC_ROW = re.compile(r"^\|\s*`(oncelog_\w+)`\s*\|\s*(\w+)\s*\|", re.MULTILINE)


def test_every_exported_metric_is_documented(observed: Observed) -> None:
    exported: dict[str, str] = {}
    for body in _exposition(observed.cluster).values():
        for name, kind in _TYPE_LINE.findall(body):
            exported[name.decode()] = kind.decode()
    documented = dict(_DOC_ROW.findall(Path(METRICS_DOC).read_text()))
    assert {n: t for n, t in exported.items() if documented.get(n) != t} == {}, \
        "exported but not documented (or documented with another type) in docs/metrics.md"
    assert sorted(set(documented) - set(exported)) == [], \
        "documented in docs/metrics.md but exported by no process"


def _value(prom: PrometheusServer, expr: str) -> float:
    result = prom.query(expr)
    assert len(result) == 1, f"{expr}: {result}"
    return float(result[0]["value"][1])


def test_the_workload_moved_what_the_panels_show(observed: Observed) -> None:
    """Guards the checks above: series that exist from the start at zero
    would pass them without any event behind them."""
    prom = observed.prometheus
    topic = observed.workload.topic
    transitions = "oncelog_coordinator_txn_state_transitions_total"
    assert _value(prom, f'sum({transitions}{{to_state="CompleteCommit"}})') >= 3
    assert _value(prom, f'sum({transitions}{{to_state="CompleteAbort"}})') >= 2
    assert _value(prom, 'sum(oncelog_coordinator_producer_fencings_total{reason="init"})') >= 2
    assert _value(prom, "sum(oncelog_coordinator_txn_timeouts_total)") >= 1
    fenced = 'code=~"PRODUCER_FENCED|INVALID_PRODUCER_EPOCH"'
    assert _value(prom, f"sum(oncelog_rpc_errors_total{{{fenced}}})") >= 1
    assert _value(prom, f"sum(oncelog_rpc_result_errors_total{{{fenced}}})") >= 1
    assert _value(prom, f'sum(oncelog_store_fetch_records_total{{topic="{topic}"}})') > 0
    assert _value(prom, f'sum(oncelog_store_produce_records_total{{topic="{topic}"}})') > 200
    # The transaction still open on partition 0, with a committed record
    # behind it (on every replica: max over the stores).
    partition_0 = f'{{topic="{topic}",partition="0"}}'
    assert _value(prom, f"max(oncelog_store_unstable_offsets{partition_0})") >= 2
    assert _value(prom, f"max(oncelog_store_open_transactions{partition_0})") == 1
    assert _value(prom, "sum(oncelog_store_snapshots_taken_total)") > 0
    assert _value(prom, "sum(oncelog_store_fsync_latency_seconds_count)") > 0
    # The deposed leader: a controller, elections, a follower dropped from
    # the ISR and added back, a truncated tail, followers reporting lag.
    assert _value(prom, "sum(oncelog_store_controller_elections_total)") >= 1
    assert _value(prom, "sum(oncelog_store_leader_elections_total)") >= 1
    assert _value(prom, "sum(oncelog_store_isr_shrinks_total)") >= 1
    assert _value(prom, "sum(oncelog_store_isr_expands_total)") >= 1
    truncations = f'oncelog_store_replica_truncations_total{{topic="{REPLICATED_TOPIC}"}}'
    assert _value(prom, f"sum({truncations})") >= 1
    assert _value(prom, "count(oncelog_store_replica_lag_offsets)") >= 1
    assert _value(prom, "sum(oncelog_store_leader_partitions)") > 0
