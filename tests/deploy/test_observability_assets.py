"""The Grafana dashboard and the Prometheus alert rules in ``deploy/observability/``.

Every PromQL query is parsed (``promql-parser``, a real PromQL grammar) and each metric it selects
must be a series the worker exports: the names ``worker/`` passes to ``Metrics.increment`` /
``gauge`` / ``timing`` (found in the source, so the kind is the one the code uses), translated by
``prometheus_export`` exactly as ``/metrics`` translates them, plus the process collectors' series.
A renamed or retyped metric therefore fails here before a dashboard goes blank.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest
import yaml
from yamllint import linter as yamllint_linter
from yamllint.config import YamlLintConfig

from tests.paths import REPO_ROOT
from worker.runtime.observability import metrics_names
from worker.runtime.observability.prometheus_export import (
    ExportedMetrics,
    build_registry,
    prometheus_name,
    timing_base_name,
)

OBSERVABILITY = REPO_ROOT / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
RULES = OBSERVABILITY / "prometheus-rules.yaml"
WORKER_SOURCE = REPO_ROOT / "worker"

# Series Prometheus itself adds, and labels its Kubernetes service discovery attaches to every target.
PROMETHEUS_SERIES = {"up"}
TARGET_LABELS = {"namespace", "pod", "instance", "job", "container", "service", "endpoint"}
# Grafana's variables, replaced by values of their type before parsing.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "1h",
    "$namespace": ".*",
    "$pod": ".*",
}
RECORDING_KINDS = ("increment", "gauge", "timing")


# --- what the code declares ------------------------------------------------------------------------


def _declared_names() -> dict[str, str]:
    """``metrics_names`` constant name -> metric name."""
    return {k: v for k, v in vars(metrics_names).items() if k.isupper() and isinstance(v, str)}


def _metric_constants(node: ast.AST) -> Iterator[str]:
    """The ``metrics_names`` constants an expression refers to (``m.X``, ``labelled(m.X, ...)``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.attr.isupper():
            yield sub.attr


# Recorded through a helper that builds the labelled key (the kind cannot be read off the call).
INDIRECT = {metrics_names.RECORDS_PRODUCED: "increment"}  # OwnedPartition._produced_key


def _first_constant(call: ast.Call) -> str | None:
    """``X`` of a call whose first argument is ``m.X`` (``labelled(m.X, ...)``, ``self._key(m.X, ...)``)."""
    if call.args and isinstance(call.args[0], ast.Attribute) and isinstance(call.args[0].value, ast.Name):
        attr = call.args[0].attr
        return attr if attr.isupper() else None
    return None


@functools.cache
def recorded_metrics() -> dict[str, tuple[str, set[str]]]:
    """Every metric name the worker records: its kind (increment / gauge / timing) and label names."""
    declared = _declared_names()
    kinds: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for path in sorted(WORKER_SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            constant = _first_constant(node)
            if constant in declared and not (
                isinstance(node.func, ast.Attribute) and node.func.attr in RECORDING_KINDS
            ):
                labels.setdefault(declared[constant], set()).update(k.arg for k in node.keywords if k.arg)
            if not (isinstance(node.func, ast.Attribute) and node.func.attr in RECORDING_KINDS and node.args):
                continue
            for found in _metric_constants(node.args[0]):
                name = declared.get(found)
                if name is None:
                    continue
                kind = node.func.attr
                assert kinds.setdefault(name, kind) == kind, f"{name} is recorded as {kinds[name]} and {kind}"
    for name, kind in INDIRECT.items():
        assert name not in kinds, f"{name} is now recorded directly: drop it from INDIRECT"
        kinds[name] = kind
    return {name: (kind, labels.get(name, set())) for name, kind in kinds.items()}


@functools.cache
def exported_series() -> dict[str, set[str]]:
    """Every series name ``/metrics`` can show -> the label names it can carry."""
    series: dict[str, set[str]] = {}
    for name, (kind, labels) in recorded_metrics().items():
        if kind == "increment":
            series[prometheus_name(name) + "_total"] = labels
        elif kind == "gauge":
            series[prometheus_name(name)] = labels
        else:
            base = timing_base_name(name)
            series[base + "_bucket"] = labels | {"le"}
            series[base + "_sum"] = labels
            series[base + "_count"] = labels
    for family in build_registry(ExportedMetrics()).collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


# --- the queries -----------------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def _dashboard_queries() -> list[tuple[str, str]]:
    dashboard = _dashboard()
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"])
            assert match, f"variable {variable['name']}: expected label_values(selector, label)"
            out.append((f"variable {variable['name']}", match.group(1)))
    return out


def _all_queries() -> list[tuple[str, str]]:
    rules = [(f"alert {rule['alert']}", rule["expr"]) for rule in _rules()]
    return _dashboard_queries() + rules


def _substituted(expr: str) -> str:
    for variable in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, GRAFANA_VARIABLES[variable])
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """Each vector selector of a PromQL expression: its metric name and the label names it uses."""
    found: list[tuple[str, set[str]]] = []
    _walk(promql_parser.parse(_substituted(expr)), found, set())
    return found


def _walk(node: Any, found: list[tuple[str, set[str]]], grouping: set[str]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        labels = {matcher.name for matcher in node.matchers.matchers}
        name = node.name
        if name is None:  # {__name__="..."}
            names = [m.value for m in node.matchers.matchers if m.name == "__name__"]
            assert names, "a selector without a metric name"
            name = names[0]
        found.append((name, (labels - {"__name__"}) | grouping))
        return
    if isinstance(node, promql_parser.AggregateExpr):
        modifier = node.modifier
        if modifier is not None and modifier.type == promql_parser.AggModifierType.By:
            grouping = grouping | set(modifier.labels)
        _walk(node.expr, found, grouping)
        if node.param is not None:
            _walk(node.param, found, set())
        return
    if isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, found, grouping)
        return
    if isinstance(node, promql_parser.Call):
        for arg in node.args:
            _walk(arg, found, grouping)
        return
    if isinstance(node, promql_parser.BinaryExpr):
        _walk(node.lhs, found, grouping)
        _walk(node.rhs, found, grouping)
        return
    if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        _walk(node.expr, found, grouping)
        return
    assert isinstance(node, promql_parser.NumberLiteral | promql_parser.StringLiteral), type(node)


# --- tests -----------------------------------------------------------------------------------------


def test_the_code_records_every_declared_name_as_one_kind() -> None:
    recorded = recorded_metrics()
    assert set(recorded) == set(_declared_names().values()), "a declared metric is never recorded"
    assert recorded[metrics_names.CONSUMER_LAG] == ("gauge", {"partition"})
    assert recorded[metrics_names.COMMIT_MS][0] == "timing"
    assert recorded[metrics_names.RECORDS_CONSUMED][0] == "increment"


def test_exported_series_match_a_real_scrape() -> None:
    """The translation the checks rely on is the one ``/metrics`` serves."""
    metrics = ExportedMetrics()
    metrics.increment(metrics_names.RECORDS_CONSUMED)
    metrics.gauge(metrics_names.REQUESTS_OPEN, 3)
    metrics.timing(metrics_names.COMMIT_MS, 12.0)
    scraped = {s.name for family in build_registry(metrics).collect() for s in family.samples}
    series = exported_series()
    assert {
        "derender_records_consumed_total",
        "derender_requests_open",
        "derender_commit_seconds_bucket",
        "derender_commit_seconds_count",
    } <= scraped
    assert scraped <= set(series) | {"derender_records_consumed_created", "derender_commit_seconds_created"}


@pytest.mark.parametrize(("where", "expr"), _all_queries(), ids=[w for w, _ in _all_queries()])
def test_every_query_selects_exported_series(where: str, expr: str) -> None:
    series = exported_series()
    used = selectors(expr)
    assert used, f"{where}: selects no metric"
    for name, labels in used:
        if name in PROMETHEUS_SERIES:
            continue
        assert name in series, f"{where}: {name} is not a metric the worker exports"
        unknown = labels - series[name] - TARGET_LABELS
        assert not unknown, f"{where}: {name} has no label(s) {sorted(unknown)}"


def test_the_check_catches_a_renamed_metric_and_a_wrong_kind() -> None:
    series = exported_series()
    assert "derender_records_consumed_total" in series
    assert "derender_records_consumed" not in series  # a counter without _total
    assert "derender_commit_seconds" not in series  # a histogram without _bucket/_sum/_count
    [(name, labels)] = selectors('sum by (partition) (rate(derender_records_consumd_total{pod=~"$pod"}[5m]))')
    assert name not in series
    assert labels == {"pod", "partition"}
    with pytest.raises(ValueError, match="unclosed left parenthesis"):
        promql_parser.parse("sum(rate(derender_records_consumed_total[5m])")


def test_dashboard_shows_what_operators_need() -> None:
    dashboard = _dashboard()
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    names = {name for _, expr in _dashboard_queries() for name, _ in selectors(expr)}
    needed = {
        "derender_records_consumed_total",  # throughput
        "derender_consumer_lag",  # lag per partition
        "derender_commit_seconds_bucket",  # commit latency
        "derender_transactions_aborted_total",
        "derender_records_dead_lettered_total",
        "derender_dead_letters_breaker_trips_total",
        "derender_requests_open",
        "derender_requests_open_limit",
        "derender_state_bytes",
        "derender_state_bytes_limit",
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "gen_ai_server_output_tokens_total",
        "gen_ai_server_requests_total",
        "derender_error_records_total",
    }
    assert needed <= names, sorted(needed - names)
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_alert_rules_are_complete() -> None:
    rules = _rules()
    assert len({r["alert"] for r in rules}) == len(rules)
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    alerted = {name for rule in rules for name, _ in selectors(rule["expr"])}
    assert {
        "derender_consumer_lag",
        "derender_partitions_paused",
        "derender_transactions_aborted_total",
        "derender_requests_rejected_total",
    } <= alerted


def test_rules_file_passes_yamllint() -> None:
    config = YamlLintConfig("extends: default\nrules:\n  line-length: {max: 110}\n")
    problems = [
        f"{p.line}:{p.column} {p.message}"
        for p in yamllint_linter.run(RULES.read_text(encoding="utf-8"), config, str(RULES))
    ]
    assert problems == []
