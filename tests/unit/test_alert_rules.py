"""The alert rules in helm/oncelog/alerts/, checked by promtool.

Goal: every rule file passes `promtool check rules`; the unit tests in
alerts/tests/ pass `promtool test rules` (each alert fires on its condition,
not before its `for`, not on the healthy look-alike); every alert is unit
tested firing at least once and staying quiet at least once; every alert
carries a severity and the annotations a receiver shows.

Method: Debian's promtool (scripts/setup.sh installs it) on the files as
discovered from the folders; the rule files read with PyYAML for the
structural checks. Whether each expression returns series on a real
cluster is tests/integration/test_monitoring_prometheus.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.monitoring import ALERT_TESTS_DIR, ALERTS_DIR
from tests.support.prometheus import find_tool

RULE_FILES = sorted(ALERTS_DIR.glob("*.yaml"))
TEST_FILES = sorted(ALERT_TESTS_DIR.glob("*.yaml"))
SEVERITIES = {"critical", "warning", "info"}


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_tool("promtool"), *map(str, args)], capture_output=True,
                          text=True, timeout=120, check=False)


def _alerts(path: Path) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_rule_and_test_files_exist() -> None:
    assert RULE_FILES, f"no rule file in {ALERTS_DIR}"
    assert TEST_FILES, f"no promtool unit test in {ALERT_TESTS_DIR}"


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    # promtool resolves a test's rule_files relative to the test file.
    result = _promtool("test", "rules", *TEST_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules_fails_on_a_wrong_expectation(tmp_path: Path) -> None:
    """The unit tests can fail: an expectation shifted by one minute does."""
    source = ALERT_TESTS_DIR / "oncelog.rules.test.yaml"
    text = source.read_text().replace("eval_time: 18m", "eval_time: 16m", 1)
    assert text != source.read_text()
    mutated = tmp_path / source.name
    mutated.write_text(text.replace("- ../", f"- {ALERTS_DIR}/"))
    result = _promtool("test", "rules", mutated)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_every_alert_has_severity_annotations_and_a_for(path: Path) -> None:
    problems = []
    for alert in _alerts(path):
        name = alert["alert"]
        if alert.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity label not one of {sorted(SEVERITIES)}")
        annotations = alert.get("annotations", {})
        for key in ("summary", "description"):
            if not str(annotations.get(key, "")).strip():
                problems.append(f"{name}: no {key} annotation")
        if not alert.get("for"):
            problems.append(f"{name}: no `for` (one bad scrape would page)")
    assert problems == []


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text()).get("tests", []):
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {alert["alert"] for path in RULE_FILES for alert in _alerts(path)}
    assert sorted(names - fired) == [], "never tested firing"
    assert sorted(names - quiet) == [], "never tested staying quiet"
