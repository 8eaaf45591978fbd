"""The Grafana dashboard: generated, shipped in a ConfigMap for the sidecar, laid out, filtered."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.chart import metrics_contract
from tests.chart.helm import CHART, ROOT, one, render

DASHBOARD = CHART / "files" / "dashboards" / "npu-inference.json"


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_dashboard", ROOT / "scripts" / "gen_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in board["panels"] if panel["type"] != "row"]


def test_the_committed_dashboard_is_the_generated_one() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == generator().render(), (
        "run scripts/gen_dashboard.py and commit the JSON"
    )


def test_the_configmap_carries_the_dashboard_for_the_sidecar(tmp_path: Path, board: dict[str, Any]) -> None:
    values = {"monitoring": {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}}}
    configmap = one(render(values, tmp_path), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert json.loads(configmap["data"]["npu-inference.json"]) == board


def test_the_issues_panels_are_there(board: dict[str, Any]) -> None:
    titles = {panel["title"] for panel in panels(board)}
    assert {
        "Effective graph mode",
        "Graph-mode downgrades",
        "Capture memory per batch size",
        "Capture time per batch size",
        "Replay latency p50 per batch size",
        "Replay latency p99 per batch size",
        "Eager fallbacks per second",
        "Device memory plan (device=plan) and what the engine saw",
        "Time to first token",
        "Inter-token latency",
        "Requests running and waiting",
        "Replay latency p99 per rank",
        "Graph-mode downgrades per rank",
    } <= titles


def test_the_rank_panels_split_by_the_podmonitors_rank_labels(board: dict[str, Any]) -> None:
    """`group` and `node_rank`: the target labels the PodMonitors' relabelings give LeaderWorkerSet pods."""
    from npu_operator.kube import names as builders

    by_title = {panel["title"]: panel for panel in panels(board)}
    for title in ("Replay latency p99 per rank", "Graph-mode downgrades per rank"):
        expr = by_title[title]["targets"][0]["expr"]
        assert all(f"{label}," in expr for label in builders.RANK_TARGET_LABELS), (title, expr)


def test_panels_tile_the_grid_without_overlapping(board: dict[str, Any]) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])


def test_every_query_uses_the_chosen_data_source(board: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in panels(board):
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


def test_inference_queries_follow_the_namespace_and_npuinference_variables(board: dict[str, Any]) -> None:
    """Every selector of an inference pod's series is filtered by both variables."""
    for panel in panels(board):
        for target in panel["targets"]:
            for name in metrics_contract.used(target["expr"]):
                if name.startswith("npu_operator_"):
                    continue
                if name.startswith("kube_horizontalpodautoscaler_"):  # KEDA's HPA of the chosen resources
                    for selector in _selectors(target["expr"], name):
                        assert 'namespace=~"$namespace"' in selector, (panel["title"], selector)
                        assert 'horizontalpodautoscaler=~"keda-hpa-$npuinference"' in selector, selector
                    continue
                for selector in _selectors(target["expr"], name):
                    assert 'namespace=~"$namespace"' in selector, (panel["title"], selector)
                    assert 'inference_npu_dev_name=~"$npuinference"' in selector, (panel["title"], selector)


def _selectors(expr: str, name: str) -> list[str]:
    found = []
    start = expr.find(name + "{")
    while start != -1:
        end = expr.index("}", start)
        found.append(expr[start : end + 1])
        start = expr.find(name + "{", end)
    assert found, f"{name} used without a label selector in {expr}"
    return found


def test_the_npuinference_variable_reads_the_podmonitors_label(board: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["npuinference"]["definition"].endswith(", inference_npu_dev_name)")
    assert variables["namespace"]["definition"].endswith(", namespace)")


def test_panels_that_only_an_npu_fills_say_so(board: dict[str, Any]) -> None:
    """The list tests/e2e/test_dashboard_queries.py checks against a real Prometheus on CPU."""
    npu_only = generator().NPU_ONLY
    titles = {panel["title"] for panel in panels(board)}
    assert npu_only <= titles, npu_only - titles
    for panel in panels(board):
        assert ("NPU only:" in panel["description"]) == (panel["title"] in npu_only), panel["title"]
    for title in npu_only:
        assert title in board["description"]


def test_the_adapter_panels_read_the_runtimes_lora_series_and_say_they_need_spec_lora(board: dict[str, Any]) -> None:
    lora_only = generator().LORA_ONLY
    by_title = {panel["title"]: panel for panel in panels(board)}
    assert lora_only <= by_title.keys()
    assert "npu_lora_requests_total{" in by_title["Requests per adapter"]["targets"][0]["expr"]
    assert "npu_lora_adapter_loaded{" in by_title["Pods holding each adapter"]["targets"][0]["expr"]
    for title in lora_only:
        assert "Needs spec.lora" in by_title[title]["description"]


def test_the_cache_routing_panels_read_the_routers_series_and_say_they_need_it(board: dict[str, Any]) -> None:
    cache_only = generator().CACHE_ONLY
    by_title = {panel["title"]: panel for panel in panels(board)}
    assert cache_only <= by_title.keys()
    reasons = by_title["Prefill choices by reason"]["targets"][0]["expr"]
    assert "npu_router_choice_reasons_total{" in reasons and 'role="prefill"' in reasons
    assert (
        "npu_router_prefix_tokens_saved_total{"
        in by_title["Prefix tokens saved per prefill engine"]["targets"][0]["expr"]
    )
    for title in cache_only:
        assert "Needs spec.cacheAwareRouting" in by_title[title]["description"]


def test_the_scaling_panels_show_replicas_and_the_target(board: dict[str, Any]) -> None:
    """spec.autoscaling's panels: desired vs current (and max) replicas, and the per-replica load against the
    target, from KEDA's HPA (named keda-hpa-<resource>) as kube-state-metrics exports it."""
    keda_only = generator().KEDA_ONLY
    by_title = {panel["title"]: panel for panel in panels(board)}
    assert keda_only <= by_title.keys()
    replicas = " ".join(t["expr"] for t in by_title["Replicas: current, desired and max"]["targets"])
    for series in ("status_current_replicas", "status_desired_replicas", "spec_max_replicas"):
        assert f"kube_horizontalpodautoscaler_{series}{{" in replicas
    load = [t["expr"] for t in by_title["Running requests per replica and the target"]["targets"]]
    assert "vllm:num_requests_running{" in load[0] and "status_current_replicas" in load[0]
    assert 'metric_name="s0-prometheus"' in load[1]  # KEDA's name for the first trigger: running requests
    for title in keda_only:
        assert "Needs KEDA and kube-state-metrics" in by_title[title]["description"]
