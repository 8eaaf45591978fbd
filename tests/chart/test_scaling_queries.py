"""The ScaledObject's Prometheus queries evaluated by Prometheus' own engine (`promtool test rules`,
promql_expr_test): each returns one element, the value KEDA compares with the per-replica target, for
one resource only (not a neighbour's pods in the same namespace, nor a namesake in another namespace).

The queries and thresholds come from the operator's own rendered ScaledObject, so a change to
`npu_operator.scaling` is tested here as it ships. Series carry the labels the PodMonitors give them.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import yaml
from npu_operator.api.config import OperatorConfig
from npu_operator.children import kinds as builders
from npu_operator.children import scaling
from npu_operator.controller.desired import adopted_children, read_spec

from tests.examples import example


def labels(namespace: str, resource: str, pod: str, engine: str) -> str:
    return (
        f'namespace="{namespace}", inference_npu_dev_name="{resource}", pod="{pod}", engine="{engine}", '
        f'model_name="m", container="runtime", endpoint="http", job="{namespace}/{resource}", '
        f'instance="10.0.0.1:8000"'
    )


def scaled_object() -> dict[str, Any]:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["metadata"]["uid"] = "u"
    spec, problems = read_spec(manifest, OperatorConfig())
    assert spec is not None and not problems
    objects = adopted_children(manifest, spec, OperatorConfig(), builders.Capabilities.everything())
    return next(o for o in objects if o["kind"] == "ScaledObject")


# qwen25-7b in llm: two pods (one DP rank each) with 30 and 23 running, 4 and 0 waiting; a neighbour in
# the same namespace and a namesake in another namespace with much more, which must not count.
SERIES = [
    ("vllm:num_requests_running", labels("llm", "qwen25-7b", "qwen25-7b-a", "0"), "30x10"),
    ("vllm:num_requests_running", labels("llm", "qwen25-7b", "qwen25-7b-b", "0"), "23x10"),
    ("vllm:num_requests_running", labels("llm", "neighbour", "neighbour-a", "0"), "400x10"),
    ("vllm:num_requests_running", labels("research", "qwen25-7b", "qwen25-7b-c", "0"), "900x10"),
    ("vllm:num_requests_waiting", labels("llm", "qwen25-7b", "qwen25-7b-a", "0"), "4x10"),
    ("vllm:num_requests_waiting", labels("llm", "qwen25-7b", "qwen25-7b-b", "0"), "0x10"),
    ("vllm:num_requests_waiting", labels("llm", "neighbour", "neighbour-a", "0"), "77x10"),
    (
        "llm_d_epp_flow_control_queue_size",
        'namespace="llm", inference_pool="qwen25-7b", fairness_id="d", priority="0", model_name="m", '
        'target_model_name="m", pod="qwen25-7b-epp-x", job="llm/qwen25-7b-epp"',
        "6x10",
    ),
    (
        "llm_d_epp_flow_control_queue_size",
        'namespace="llm", inference_pool="neighbour", fairness_id="d", priority="0", model_name="m", '
        'target_model_name="m", pod="neighbour-epp-x", job="llm/neighbour-epp"',
        "50x10",
    ),
]
EXPECTED = {"running-requests": 53, "waiting-requests": 4, "held-requests": 6}


def test_each_query_returns_one_resources_value_and_the_replicas_keda_asks_for(promtool: str, tmp_path: Path) -> None:
    triggers = {t["name"]: t["metadata"] for t in scaled_object()["spec"]["triggers"]}
    # The held-requests trigger only exists with minReplicas 0; its query is the same function's.
    triggers.setdefault("held-requests", {"query": scaling.picker_queue_query("qwen25-7b", "llm"), "threshold": "38"})
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": f"{name}{{{where}}}", "values": values} for name, where, values in SERIES],
                "promql_expr_test": [
                    # One element without labels: what KEDA's Prometheus scaler requires (more is an error).
                    {"expr": triggers[name]["query"], "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": n}]}
                    for name, n in EXPECTED.items()
                ],
            }
        ],
    }
    (tmp_path / "scaling.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", "scaling.test.yaml"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # With metricType AverageValue the HPA asks for ceil(value / threshold) replicas: 53 running
    # requests against 38 per replica (80% of the 48 the plan captures) ask for 2.
    assert triggers["running-requests"]["threshold"] == "38"
    assert math.ceil(EXPECTED["running-requests"] / int(triggers["running-requests"]["threshold"])) == 2


def pd_scaled_objects() -> dict[str, dict[str, Any]]:
    manifest = example("deepseek-r1-w8a8-pd.yaml")
    manifest["metadata"]["uid"] = "u"
    manifest["spec"]["autoscaling"] = {"maxReplicas": 4}
    manifest["spec"]["metrics"] = {"podMonitor": {"enabled": True}}
    spec, problems = read_spec(manifest, OperatorConfig())
    assert spec is not None and not problems, problems
    objects = adopted_children(manifest, spec, OperatorConfig(), builders.Capabilities.everything())
    return {t["name"]: t["metadata"] for o in objects if o["kind"] == "ScaledObject" for t in o["spec"]["triggers"]}


def role_labels(resource: str, pod: str, role: str, engine: str = "0") -> str:
    return labels("llm", resource, pod, engine) + f', inference_npu_dev_role="{role}"'


def router_work(resource: str, role: str, engine: str) -> str:
    return (
        f'namespace="llm", inference_npu_dev_name="{resource}", inference_npu_dev_role="router", '
        f'pod="{resource}-router", role="{role}", engine="http://{engine}:8000", job="llm/{resource}"'
    )


# deepseek-r1-pd in llm: a decode engine (40 running, 2 waiting) and a prefill engine (3 running, which
# the decode triggers must not count); the router's outstanding prompt tokens at two prefill engines,
# one steady at 1000, one a spike of 8000 for one scrape of four (a minute's average: 2000), and its
# decode work (never prefill's load); a neighbour's router.
PD = "deepseek-r1-pd"
PD_SERIES = [
    ("vllm:num_requests_running", role_labels(PD, f"{PD}-d", "decode"), "40x40"),
    ("vllm:num_requests_running", role_labels(PD, f"{PD}-p", "prefill"), "3x40"),
    ("vllm:num_requests_waiting", role_labels(PD, f"{PD}-d", "decode"), "2x40"),
    ("vllm:num_requests_waiting", role_labels(PD, f"{PD}-p", "prefill"), "9x40"),
    ("npu_router_engine_work", router_work(PD, "prefill", "10.0.0.1"), "1000x40"),
    ("npu_router_engine_work", router_work(PD, "prefill", "10.0.0.2"), "0x36 8000 0 0 0"),
    ("npu_router_engine_work", router_work(PD, "decode", "10.0.0.3"), "5000x40"),
    ("npu_router_engine_work", router_work("neighbour", "prefill", "10.0.0.9"), "90000x40"),
]
PD_EXPECTED = {"running-requests": 40, "waiting-requests": 2, "queued-prefill-tokens": 3000}


def test_each_roles_queries_read_that_roles_load(promtool: str, tmp_path: Path) -> None:
    triggers = pd_scaled_objects()
    tests = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": f"{n}{{{where}}}", "values": values} for n, where, values in PD_SERIES],
                "promql_expr_test": [
                    {
                        "expr": triggers[name]["query"],
                        "eval_time": "9m50s",  # the minute (8m50s, 9m50s]: four scrapes, one the spike
                        "exp_samples": [{"labels": "{}", "value": n}],
                    }
                    for name, n in PD_EXPECTED.items()
                ],
            }
        ],
    }
    (tmp_path / "pd.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", "pd.test.yaml"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
