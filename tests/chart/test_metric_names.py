"""Every metric the dashboard and the alerts query is one the code defines (or an allowed outside one).

A renamed metric in operator/npu_operator/controller/metrics.py or runtime/npu_runtime/metrics.py breaks
these tests until the dashboard (scripts/gen_dashboard.py) and the alerts follow it; so does a
metric name in docs/design.md's table that the dashboard does not show.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import types
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from tests.chart import metrics_contract
from tests.chart.helm import CHART, JSON, one, render
from tests.design_metrics import DESIGN_TABLE, OPERATOR_PREFIX

DASHBOARD = CHART / "files" / "dashboards" / "npu-inference.json"
METRICS_MODULES = ("npu_operator.controller.metrics", "npu_runtime.metrics")

# The contract: docs/design.md's metric table, name -> type.
DESIGN_METRICS = {name: kind for name, (kind, _labels) in DESIGN_TABLE.items()}
# vLLM's own metrics the dashboard uses (port 8000), as vLLM 0.31 defines them in
# vllm/v1/metrics/loggers.py (prometheus_client names: counters without _total).
VLLM_METRICS = {
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:generation_tokens": "counter",
}
# Outside the project: Prometheus' own `up` per target, and kube-state-metrics (three alerts and
# the autoscaling panels: KEDA's HPA of a resource, as kube-state-metrics' horizontalpodautoscaler
# collector exports it).
OUTSIDE_METRICS = {
    "up": "gauge",
    "kube_pod_status_ready": "gauge",
    "kube_pod_container_status_restarts_total": "counter",
    "kube_horizontalpodautoscaler_status_current_replicas": "gauge",
    "kube_horizontalpodautoscaler_status_desired_replicas": "gauge",
    "kube_horizontalpodautoscaler_spec_max_replicas": "gauge",
    "kube_horizontalpodautoscaler_spec_target_metric": "gauge",
}


def defined() -> dict[str, str]:
    """{family: kind} over every metrics module."""
    families: dict[str, str] = {}
    for name in METRICS_MODULES:
        families.update(metrics_contract.declared(importlib.import_module(name)))
    return families


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every variable's selector."""
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [
        (f"panel {panel['title']!r} {target['refId']}", target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            selector = metrics_contract.variable_selector(variable["definition"])
            assert selector, f"variable {variable['name']}: not label_values(selector, label)"
            queries.append((f"variable {variable['name']}", selector))
    return queries


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> list[JSON]:
    objects = render({"monitoring": {"prometheusRule": {"enabled": True}}}, tmp_path_factory.mktemp("rules"))
    rule_groups: list[JSON] = one(objects, "PrometheusRule")["spec"]["groups"]
    return [rule for group in rule_groups for rule in group["rules"]]


def alert_queries(rules: list[JSON]) -> list[tuple[str, str]]:
    return [(f"alert {rule['alert']}", rule["expr"]) for rule in rules]


def allowed() -> set[str]:
    outside = {**VLLM_METRICS, **OUTSIDE_METRICS}
    return metrics_contract.all_series(defined()) | metrics_contract.all_series(outside)


def unknown_names(queries: list[tuple[str, str]], known: set[str]) -> list[str]:
    return [
        f"{where}: {name}"
        for where, expr in queries
        for name in sorted(metrics_contract.used(expr))
        if name not in known
    ]


# --- the queries ---------------------------------------------------------------------------------


def test_every_query_is_valid_promql(rules: list[JSON]) -> None:
    problems = []
    for where, expr in [*dashboard_queries(), *alert_queries(rules)]:
        try:
            metrics_contract.parse(expr)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
    assert not problems, "\n".join(problems)


def test_the_alerts_are_the_ones_the_chart_documents(rules: list[JSON]) -> None:
    assert sorted(rule["alert"] for rule in rules) == [
        "NPUGraphEagerFallbackRateHigh",
        "NPUGraphInstrumentationErrors",
        "NPUGraphModeDowngradedByEngine",
        "NPUGraphModeDowngradedByPlan",
        "NPUGraphReplayLatencyRegression",
        "NPUInferenceAtMaxReplicasAboveCapturedBatch",
        "NPUInferenceCrashLooping",
        "NPUInferencePodNotReady",
        "NPUOperatorReconcileErrors",
    ]
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_metric_the_dashboard_and_alerts_use_is_defined(rules: list[JSON]) -> None:
    problems = unknown_names([*dashboard_queries(), *alert_queries(rules)], allowed())
    assert not problems, "metrics used but not defined:\n" + "\n".join(problems)


def test_every_operator_metric_the_dashboard_and_alerts_use_is_defined(rules: list[JSON]) -> None:
    """The half of the check that needs no runtime module: npu_operator_* names."""
    queries = [
        (where, expr) for where, expr in [*dashboard_queries(), *alert_queries(rules)] if "npu_operator_" in expr
    ]
    assert queries
    operator = metrics_contract.declared(importlib.import_module("npu_operator.controller.metrics"))
    known = metrics_contract.all_series(operator) | metrics_contract.all_series({**VLLM_METRICS, **OUTSIDE_METRICS})
    problems = [p for p in unknown_names(queries, known) if "npu_operator_" in p]
    assert not problems, "\n".join(problems)


def test_every_design_metric_appears_in_the_dashboard() -> None:
    in_dashboard = set().union(*(metrics_contract.used(expr) for _, expr in dashboard_queries()))
    missing = [name for name, kind in DESIGN_METRICS.items() if not metrics_contract.series(name, kind) & in_dashboard]
    assert not missing, f"docs/design.md metrics without a dashboard panel: {missing}"


# --- the definitions -----------------------------------------------------------------------------


def test_the_operator_defines_its_design_metrics() -> None:
    operator = metrics_contract.declared(importlib.import_module("npu_operator.controller.metrics"))
    found = {metrics_contract.contract_name(name, kind): kind for name, kind in operator.items()}
    expected = {name: kind for name, kind in DESIGN_METRICS.items() if name.startswith(OPERATOR_PREFIX)}
    assert {name: found.get(name) for name in expected} == expected


def test_the_runtime_defines_its_design_metrics() -> None:
    runtime = metrics_contract.declared(importlib.import_module("npu_runtime.metrics"))
    found = {metrics_contract.contract_name(name, kind): kind for name, kind in runtime.items()}
    expected = {name: kind for name, kind in DESIGN_METRICS.items() if not name.startswith(OPERATOR_PREFIX)}
    assert {name: found.get(name) for name in expected} == expected


def test_the_vllm_names_are_vllms() -> None:
    """Where vLLM is installed (CI's .venv has the CPU build), its source defines each name."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here")
    source = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text(encoding="utf-8")
    kinds = {"gauge": "_gauge_cls", "counter": "_counter_cls", "histogram": "_histogram_cls"}
    for name, kind in VLLM_METRICS.items():
        pattern = rf"{kinds[kind]}\(\s*name=\"{re.escape(name)}\""
        assert re.search(pattern, source), f"{name} is not a {kind} in vLLM's {spec.origin}"


# --- the checker itself --------------------------------------------------------------------------


def test_the_checker_finds_declared_metrics_of_every_shape() -> None:
    registry = prometheus_client.CollectorRegistry()
    module = types.ModuleType("fake_metrics")
    module.REQUESTS = prometheus_client.Counter("fake_requests", "", registry=registry)  # type: ignore[attr-defined]
    module.LATENCY = prometheus_client.Histogram("fake_latency_seconds", "", registry=registry)  # type: ignore[attr-defined]
    module.SPECS = (types.SimpleNamespace(name="fake_mode_info", kind="gauge"),)  # type: ignore[attr-defined]
    module.ERRORS = types.SimpleNamespace(name="fake_errors_total", kind="counter")  # type: ignore[attr-defined]
    families = metrics_contract.declared(module)
    assert families == {
        "fake_requests": "counter",
        "fake_latency_seconds": "histogram",
        "fake_mode_info": "gauge",
        "fake_errors_total": "counter",
    }
    assert metrics_contract.all_series(families) >= {
        "fake_requests_total",
        "fake_latency_seconds_bucket",
        "fake_latency_seconds_count",
        "fake_mode_info",
        "fake_errors_total",
    }
    assert "fake_latency_seconds" not in metrics_contract.all_series(families), "a histogram has no bare series"


def test_the_checker_sees_a_renamed_metric(rules: list[JSON]) -> None:
    queries: list[tuple[str, Any]] = [
        (where, expr.replace("npu_operator_reconciles_total", "npu_operator_reconciliations_total"))
        for where, expr in alert_queries(rules)
    ]
    operator = metrics_contract.declared(importlib.import_module("npu_operator.controller.metrics"))
    problems = unknown_names(queries, metrics_contract.all_series(operator) | {"up"})
    assert any("npu_operator_reconciliations_total" in problem for problem in problems)


def test_the_parser_reads_grafana_queries_and_refuses_broken_ones() -> None:
    assert metrics_contract.used(
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{namespace=~"$namespace"}[$__rate_interval])))'
        " / on (x) group_left (y) b or vector(0)"
    ) == {"a_bucket", "b"}
    with pytest.raises(ValueError, match="parenthesis"):
        metrics_contract.parse("sum by (le (rate(a[5m]))")
