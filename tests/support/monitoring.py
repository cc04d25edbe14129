"""The dashboards and alert rules of helm/oncelog as data, for tests: every
PromQL expression they contain, Grafana's variables substituted, and the
forms of an alert expression that must return series on a healthy cluster.

Files are discovered from their folders (dashboards/*.json, alerts/*.yaml),
so a dashboard or rule file added later is checked without touching a test.
docs/metrics.md ("How the dashboards and alerts are checked") explains the
method.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS_DIR = ROOT / "helm" / "oncelog" / "dashboards"
ALERTS_DIR = ROOT / "helm" / "oncelog" / "alerts"
ALERT_TESTS_DIR = ALERTS_DIR / "tests"

# Grafana's built-in interval variables, as concrete values. $__rate_interval
# spans the whole workload of the Prometheus test (a minute at most), so
# rate() has samples from before and after every counter moved.
BUILTIN_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}
# $name, ${name}, ${name:format}, [[name]] (Grafana's variable syntaxes).
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")
_LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$"
)
COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})


# ------------------------------------------------------------------ dashboards


@dataclass(frozen=True, slots=True)
class Dashboard:
    path: Path
    model: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True, slots=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> list[Dashboard]:
    return [Dashboard(path, json.loads(path.read_text()))
            for path in sorted(directory.glob("*.json"))]


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, the ones inside collapsed rows included."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels") or [])


def panel_queries(dashboard: Dashboard) -> list[PanelQuery]:
    return [
        PanelQuery(dashboard.name, panel.get("title", "?"), target.get("refId", "?"),
                   target.get("expr", ""))
        for panel in iter_panels(dashboard.model.get("panels", []))
        for target in panel.get("targets") or []
    ]


def template_variables(dashboard: Dashboard) -> list[dict[str, Any]]:
    return list(dashboard.model.get("templating", {}).get("list", []))


def variable_query(variable: dict[str, Any]) -> str:
    """The PromQL-ish query of a Grafana query variable (either shape of the
    JSON model: a string, or an object with a `query` field)."""
    query = variable.get("query")
    if isinstance(query, dict):
        query = query.get("query")
    return str(query or variable.get("definition") or "")


def referenced_variables(text: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(text)}


def substitute(text: str, values: dict[str, str]) -> str:
    """Replaces Grafana variables; KeyError names an undefined one."""
    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name in BUILTIN_VARIABLES:
            return BUILTIN_VARIABLES[name]
        if name not in values:
            raise KeyError(f"undefined variable ${name}")
        return values[name]
    return _VARIABLE.sub(value, text)


def regex_alternation(values: list[str]) -> str:
    """How Grafana fills a multi-value variable used in =~: the values
    escaped for a regex inside a PromQL string, joined with |."""
    escaped = [re.sub(r"([\\$^*+?.()|{}\[\]'])", r"\\\\\1", v) for v in sorted(values)]
    return "(" + "|".join(escaped) + ")" if len(escaped) > 1 else (escaped[0] if escaped else "")


def resolve_variables(
    dashboard: Dashboard, label_values: Callable[[str | None, str], list[str]]
) -> tuple[dict[str, str], list[str]]:
    """Values for a dashboard's query variables, in order (a variable may use
    the ones before it), as Grafana would pick with "All" selected.
    `label_values(selector, label)` answers from Prometheus. Returns the
    values and the problems found (no values, an unsupported query)."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for variable in template_variables(dashboard):
        name = variable.get("name", "?")
        if variable.get("type") != "query":
            continue
        query = variable_query(variable)
        match = _LABEL_VALUES.match(query)
        if match is None:
            problems.append(f"{dashboard.name}: variable ${name}: unsupported query {query!r} "
                            "(only label_values(...) can be checked)")
            continue
        selector = match.group("selector")
        try:
            found = label_values(substitute(selector, values) if selector else None,
                                 match.group("label"))
        except Exception as exc:  # noqa: BLE001 - reported with the variable's name
            problems.append(f"{dashboard.name}: variable ${name}: {query!r}: {exc}")
            continue
        if not found:
            problems.append(f"{dashboard.name}: variable ${name}: {query!r} has no values")
        values[name] = regex_alternation(found)
    return values, problems


# ----------------------------------------------------------------- alert rules


@dataclass(frozen=True, slots=True)
class Rule:
    file: str
    group: str
    name: str
    expr: str
    is_alert: bool


def load_rules(directory: Path = ALERTS_DIR) -> list[Rule]:
    rules = []
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        document = yaml.safe_load(path.read_text()) or {}
        for group in document.get("groups", []):
            for rule in group.get("rules", []):
                rules.append(Rule(path.name, group.get("name", "?"),
                                  rule.get("alert") or rule.get("record", "?"),
                                  str(rule.get("expr", "")), "alert" in rule))
    return rules


def _render(node: Any) -> str:
    return str(node.prettify())


def _strip_parens(node: Any) -> Any:
    while isinstance(node, promql_parser.ParenExpr):
        node = node.expr
    return node


def _bool_form(node: Any) -> str:
    """The expression with every comparison reached through set operators
    (and, or, unless) turned into its `bool` form: a comparison then returns
    each pair it matched, with 0 or 1, instead of filtering them out."""
    node = _strip_parens(node)
    if isinstance(node, promql_parser.BinaryExpr):
        op = str(node.op)
        modifier = str(node.modifier) if node.modifier is not None else ""
        if op in COMPARISONS and not (node.modifier is not None and node.modifier.return_bool):
            modifier = f"bool {modifier}".strip()
        if op in COMPARISONS or op in ("and", "or", "unless"):
            return f"({_bool_form(node.lhs)}) {op} {modifier} ({_bool_form(node.rhs)})".replace(
                "  ", " ")
    return _render(node)


def unthresholded_forms(expr: str) -> list[str]:
    """The forms of an alert expression that must return series on a healthy
    cluster, where the expression itself is empty (nothing to alert on).

    * `X > Y` (any comparison): `X > bool Y` — every series X matched
      against Y, firing or not, which for two vectors proves that the vector
      matching (on/ignoring/group_left) pairs series up — and the forms of X
      and of Y themselves unless they are literals (so a fallback such as
      `(Y or vector(900))` cannot hide a Y that never returns anything).
    * `A and B`: the bool forms of A and of B each, and the two joined with
      the rule's own matching — so labels that never match fail.
    * `A or B`: the bool forms of A and of B each (each branch must work).
    * `A unless B`: the bool form of A (B may rightly be empty).
    * `absent(X)` / `absent_over_time(X)`: X.
    * anything else: the expression itself.
    """
    node = _strip_parens(promql_parser.parse(expr))
    if isinstance(node, promql_parser.BinaryExpr):
        op = str(node.op)
        if op in COMPARISONS:
            return [_bool_form(node), *_operand_forms(node.lhs), *_operand_forms(node.rhs)]
        if op == "and":
            return [*unthresholded_forms(_render(node.lhs)),
                    *unthresholded_forms(_render(node.rhs)), _bool_form(node)]
        if op == "or":
            return [*unthresholded_forms(_render(node.lhs)),
                    *unthresholded_forms(_render(node.rhs))]
        if op == "unless":
            return unthresholded_forms(_render(node.lhs))
    if isinstance(node, promql_parser.Call) and node.func.name in ("absent",
                                                                   "absent_over_time"):
        return [_render(arg) for arg in node.args]
    return [_render(node)]


def _operand_forms(node: Any) -> list[str]:
    if isinstance(_strip_parens(node), promql_parser.NumberLiteral | promql_parser.StringLiteral):
        return []
    return unthresholded_forms(_render(node))


def check_expression(query: Callable[[str], list[Any]], expr: str, *,
                     thresholded: bool) -> str | None:
    """None when the expression is valid and returns series (for a
    thresholded alert expression: when it does, or every unthresholded form
    does); else what is wrong."""
    try:
        if query(expr):
            return None
    except Exception as exc:  # noqa: BLE001 - the error is the finding
        return f"invalid: {exc}"
    if not thresholded:
        return "returned no series"
    for form in unthresholded_forms(expr):
        try:
            if not query(form):
                return f"returned no series, nor did its unthresholded form {form!r}"
        except Exception as exc:  # noqa: BLE001 - the error is the finding
            return f"unthresholded form {form!r} is invalid: {exc}"
    return None
