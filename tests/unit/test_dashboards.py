"""The Grafana dashboards' JSON structure, and the helpers that take their
expressions apart.

Goal: every file in helm/oncelog/dashboards/ is a dashboard Grafana imports
as we mean it — unique uid and title, the `oncelog` tag, a Prometheus
`datasource` variable that every panel and query variable uses, panels with
unique ids on a 24-column grid without overlaps, each with a title, a
description, a unit and targets with unique refIds and an expression that
uses only defined variables; and that the substitution of Grafana's
variables and the unthresholded forms of alert expressions
(tests/support/monitoring.py) do what docs/metrics.md says, including
failing on what they must reject.

Method: structural checks of our own over the JSON model (Grafana publishes
no JSON Schema for it), on the files as discovered from the folder; the
helpers on hand-written expressions. No cluster, no Prometheus (the real
evaluation is tests/integration/test_monitoring_prometheus.py).
"""

from __future__ import annotations

import re
from itertools import combinations
from typing import Any

import pytest

from tests.support.monitoring import (
    BUILTIN_VARIABLES,
    Dashboard,
    check_expression,
    iter_panels,
    load_dashboards,
    panel_queries,
    referenced_variables,
    regex_alternation,
    resolve_variables,
    substitute,
    template_variables,
    unthresholded_forms,
    variable_query,
)

DASHBOARDS = load_dashboards()
PROMETHEUS_DS = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text"}
GRID_COLUMNS = 24


def test_the_dashboards_are_there() -> None:
    assert {d.name for d in DASHBOARDS} >= {"overview.json", "transactions.json",
                                             "partitions.json"}


def test_uids_and_titles_are_unique_across_dashboards() -> None:
    uids = [d.model.get("uid") for d in DASHBOARDS]
    titles = [d.model.get("title") for d in DASHBOARDS]
    assert len(set(uids)) == len(uids), uids
    assert len(set(titles)) == len(titles), titles


def _structure_problems(d: Dashboard) -> list[str]:
    m = d.model
    problems = []
    uid = m.get("uid")
    if not isinstance(uid, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", uid):
        problems.append(f"uid {uid!r}: 1-40 letters, digits, - or _")
    for key in ("title", "description"):
        if not isinstance(m.get(key), str) or not m[key].strip():
            problems.append(f"no {key}")
    if "oncelog" not in (m.get("tags") or []):
        problems.append("no 'oncelog' tag (dashboard links and search use it)")
    if not isinstance(m.get("schemaVersion"), int) or m["schemaVersion"] < 36:
        problems.append(f"schemaVersion {m.get('schemaVersion')!r}: want an int >= 36")
    if not isinstance(m.get("time"), dict) or not {"from", "to"} <= set(m["time"]):
        problems.append("no time range")
    if m.get("id") not in (None,):
        problems.append("a fixed numeric id (Grafana assigns it; provisioning needs null)")
    variables = template_variables(d)
    names = [v.get("name") for v in variables]
    if len(set(names)) != len(names):
        problems.append(f"duplicate variables {names}")
    datasources = [v for v in variables if v.get("type") == "datasource"]
    if [(v.get("name"), v.get("query")) for v in datasources] != [("datasource", "prometheus")]:
        problems.append("want exactly one datasource variable: name 'datasource', "
                        "query 'prometheus'")
    for v in variables:
        if v.get("type") == "query":
            if v.get("datasource") != PROMETHEUS_DS:
                problems.append(f"variable ${v.get('name')}: datasource is not ${{datasource}}")
            if not variable_query(v):
                problems.append(f"variable ${v.get('name')}: no query")
        elif v.get("type") not in ("datasource", "custom", "constant", "interval"):
            problems.append(f"variable ${v.get('name')}: unexpected type {v.get('type')!r}")
    panels = list(iter_panels(m.get("panels") or []))
    if not panels:
        problems.append("no panels")
    ids = [p.get("id") for p in panels]
    if len(set(ids)) != len(ids) or not all(isinstance(i, int) and i > 0 for i in ids):
        problems.append(f"panel ids must be unique positive ints: {ids}")
    for p in panels:
        problems.extend(f"panel {p.get('title')!r}: {x}" for x in _panel_problems(p, names))
    problems.extend(_overlaps(m.get("panels") or []))
    return problems


def _panel_problems(p: dict[str, Any], variable_names: list[Any]) -> list[str]:
    problems = []
    if p.get("type") not in PANEL_TYPES:
        problems.append(f"type {p.get('type')!r} is not one of {sorted(PANEL_TYPES)}")
    if not str(p.get("title", "")).strip():
        problems.append("no title")
    grid = p.get("gridPos") or {}
    if not all(isinstance(grid.get(k), int) for k in ("h", "w", "x", "y")):
        problems.append(f"gridPos {grid} needs int h, w, x, y")
    elif not (grid["h"] > 0 and 0 < grid["w"] <= GRID_COLUMNS and grid["x"] >= 0
              and grid["x"] + grid["w"] <= GRID_COLUMNS and grid["y"] >= 0):
        problems.append(f"gridPos {grid} outside the {GRID_COLUMNS}-column grid")
    if p.get("type") in ("row", "text"):
        return problems
    if not str(p.get("description", "")).strip():
        problems.append("no description (the panel's (i) tooltip)")
    if p.get("datasource") != PROMETHEUS_DS:
        problems.append(f"datasource {p.get('datasource')} is not {PROMETHEUS_DS}")
    if "unit" not in (p.get("fieldConfig") or {}).get("defaults", {}):
        problems.append("no unit in fieldConfig.defaults")
    targets = p.get("targets") or []
    if not targets:
        problems.append("no targets")
    ref_ids = [t.get("refId") for t in targets]
    if len(set(ref_ids)) != len(ref_ids) or not all(ref_ids):
        problems.append(f"refIds must be unique and set: {ref_ids}")
    for t in targets:
        if t.get("datasource", PROMETHEUS_DS) != PROMETHEUS_DS:
            problems.append(f"target {t.get('refId')}: datasource is not ${{datasource}}")
        expr = str(t.get("expr", ""))
        if not expr.strip():
            problems.append(f"target {t.get('refId')}: no expr")
        undefined = referenced_variables(expr) - set(variable_names) - set(BUILTIN_VARIABLES)
        if undefined:
            problems.append(f"target {t.get('refId')}: undefined variables {sorted(undefined)}")
    return problems


def _overlaps(panels: list[dict[str, Any]]) -> list[str]:
    """Panels of one level (top-level, or inside one collapsed row) must not overlap."""
    problems = []
    boxes = [(p.get("title"), p.get("gridPos") or {}) for p in panels]
    for (a, ga), (b, gb) in combinations(boxes, 2):
        if not all(isinstance(g.get(k), int) for g in (ga, gb) for k in ("h", "w", "x", "y")):
            continue
        if (ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
                and ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"]):
            problems.append(f"panels {a!r} and {b!r} overlap")
    for p in panels:
        problems.extend(_overlaps(p.get("panels") or []))
    return problems


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda d: d.name)
def test_dashboard_structure(dashboard: Dashboard) -> None:
    assert _structure_problems(dashboard) == []


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda d: d.name)
def test_every_panel_has_queries_and_the_query_variables_are_label_values(
        dashboard: Dashboard) -> None:
    assert panel_queries(dashboard)
    for v in template_variables(dashboard):
        if v.get("type") == "query":
            assert variable_query(v).startswith("label_values("), v


def test_the_structure_checks_reject_broken_dashboards() -> None:
    [good] = [d for d in DASHBOARDS if d.name == "overview.json"]
    assert _structure_problems(good) == []

    def broken(change: Any) -> list[str]:
        import copy
        model = copy.deepcopy(good.model)
        change(model)
        return _structure_problems(Dashboard(good.path, model))

    def overlap(m: dict[str, Any]) -> None:
        m["panels"][2]["gridPos"] = dict(m["panels"][3]["gridPos"])

    def wide(m: dict[str, Any]) -> None:
        m["panels"][1]["gridPos"]["x"] = 20

    def fixed_datasource(m: dict[str, Any]) -> None:
        m["panels"][1]["datasource"] = {"type": "prometheus", "uid": "abc123"}

    def typo(m: dict[str, Any]) -> None:
        m["panels"][1]["targets"][0]["expr"] = 'up{job=~"$jobs"}'

    def duplicate_id(m: dict[str, Any]) -> None:
        m["panels"][2]["id"] = m["panels"][1]["id"]

    def no_datasource_variable(m: dict[str, Any]) -> None:
        m["templating"]["list"] = m["templating"]["list"][1:]

    for change, expected in ((overlap, "overlap"), (wide, "outside"),
                             (fixed_datasource, "datasource"), (typo, "undefined variables"),
                             (duplicate_id, "unique positive"),
                             (no_datasource_variable, "datasource variable")):
        problems = broken(change)
        assert any(expected in p for p in problems), (change.__name__, problems)


# --------------------------------------------------------------- substitution


def test_substitute_replaces_every_syntax_and_names_undefined_variables() -> None:
    values = {"job": "(a|b)", "topic": "t"}
    assert substitute('x{job=~"$job",topic=~"${topic}"}[$__rate_interval]', values) == \
        'x{job=~"(a|b)",topic=~"t"}[1m]'
    assert substitute('x{topic=~"${topic:regex}"} [[job]]', values) == 'x{topic=~"t"} (a|b)'
    with pytest.raises(KeyError, match=r"\$jobs"):
        substitute('x{job=~"$jobs"}', values)


def test_regex_alternation_escapes_like_grafana() -> None:
    assert regex_alternation(["orders.v1", "a"]) == r"(a|orders\\.v1)"
    assert regex_alternation(["only"]) == "only"


def test_resolve_variables_in_order_and_reports_empty_ones() -> None:
    model = {"templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus"},
        {"name": "job", "type": "query", "query": {"query": "label_values(up, job)"}},
        {"name": "topic", "type": "query",
         "definition": 'label_values(hw{job=~"$job"}, topic)'},
        {"name": "group", "type": "query", "query": "label_values(lag, group)"},
        {"name": "odd", "type": "query", "query": "query_result(up)"},
    ]}}
    asked = []

    def label_values(selector: str | None, label: str) -> list[str]:
        asked.append((selector, label))
        return {"job": ["j1", "j2"], "topic": ["t"], "group": []}[label]

    from pathlib import Path
    values, problems = resolve_variables(Dashboard(Path("d.json"), model), label_values)
    assert asked == [("up", "job"), ('hw{job=~"(j1|j2)"}', "topic"), ("lag", "group")]
    assert values == {"job": "(j1|j2)", "topic": "t", "group": ""}
    assert len(problems) == 2
    assert "$group" in problems[0] and "no values" in problems[0]
    assert "$odd" in problems[1] and "unsupported" in problems[1]


# -------------------------------------------------------- unthresholded forms


def test_a_threshold_becomes_a_bool_comparison_and_its_operand() -> None:
    assert unthresholded_forms('up{job="x"} == 0') == [
        '(up{job="x"}) == bool (0)', 'up{job="x"}']
    assert unthresholded_forms("sum by (r) (increase(f[5m])) > 10") == [
        "(sum by (r) (increase(f[5m]))) > bool (10)", "sum by (r) (increase(f[5m]))"]


def test_a_join_keeps_its_matching_and_each_side_is_checked() -> None:
    forms = unthresholded_forms("max by (t) (age) > on () group_left () (max(mx) or vector(900))")
    assert forms[0] == ("(max by (t) (age)) > bool on () group_left () "
                        "((max(mx)) or (vector(900)))")
    # The fallback cannot hide a missing right-hand metric.
    assert "max(mx)" in forms and "vector(900)" in forms and "max by (t) (age)" in forms


def test_set_operators() -> None:
    forms = unthresholded_forms("(a > 0) and on (t) (b == 0)")
    assert forms == ["(a) > bool (0)", "a", "(b) == bool (0)", "b",
                     "((a) > bool (0)) and on (t) ((b) == bool (0))"]
    assert unthresholded_forms("a > 1 unless b") == ["(a) > bool (1)", "a"]
    assert unthresholded_forms("a > 1 or c < 2") == ["(a) > bool (1)", "a", "(c) < bool (2)", "c"]
    assert unthresholded_forms('absent(up{job="x"})') == ['up{job="x"}']
    assert unthresholded_forms("rate(x[5m])") == ["rate(x[5m])"]


def test_check_expression_accepts_series_and_reports_the_rest() -> None:
    answers: dict[str, list[int]] = {
        "a > 1": [], "(a) > bool (1)": [1], "a": [1],
        "b > 1": [], "(b) > bool (1)": [], "b": [1],
        "c": [],
    }

    def query(expr: str) -> list[int]:
        if expr == "bad(":
            raise ValueError("parse error")
        return answers[expr]

    assert check_expression(query, "a > 1", thresholded=True) is None
    assert "unthresholded form '(b) > bool (1)'" in str(
        check_expression(query, "b > 1", thresholded=True))
    assert check_expression(query, "a > 1", thresholded=False) == "returned no series"
    assert check_expression(query, "c", thresholded=False) == "returned no series"
    assert str(check_expression(query, "bad(", thresholded=False)).startswith("invalid:")
