"""Write the chart's Grafana dashboard, files/dashboards/npu-inference.json, from the panels below.

Run after changing a panel: `.venv/bin/python scripts/gen_dashboard.py`. A test fails when the
committed JSON is out of date, and another parses every query and checks each metric name
against the runtime's and the operator's metric definitions (tests/chart/test_metric_names.py).

How labels reach Prometheus: the PodMonitors (the operator's per-resource one and the chart's
default one) copy the pod label `inference.npu.dev/name` onto every series as
`inference_npu_dev_name` (podTargetLabels); `namespace` and `pod` are prometheus-operator's
standard target labels. The dashboard's variables filter on those two.

Why plain dicts and not grafana-foundation-sdk's typed builders: on PyPI it is one build per
Grafana version (10.1 to 11.6) told apart by a timestamp epoch (`1769699998!10.1.0`), so an
unpinned install picks whichever build was uploaded last (10.1's schema today); adopting it
would rewrite this file without changing a byte users get. What breaks a dashboard in practice
is a query that answers nothing, and tests/e2e/test_dashboard_queries.py catches that by running
every panel's queries against a real Prometheus that scraped the sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGET = (
    Path(__file__).resolve().parent.parent
    / "charts"
    / "npu-inference-operator"
    / "files"
    / "dashboards"
    / "npu-inference.json"
)
UID = "npu-inference-graphs"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The series of inference pods the variables select.
SEL = 'namespace=~"$namespace", inference_npu_dev_name=~"$npuinference"'
WIDTH = 24
# Panels that can only have data on an NPU: graph capture and replay (vLLM's CPU build has no
# static graphs, so the sandbox runs NONE and has none of these series). Their descriptions say
# so; tests/e2e/test_dashboard_queries.py checks that on CPU exactly these panels are empty.
NPU_ONLY = frozenset(
    {
        "Captured batch sizes",
        "Capture memory per batch size",
        "Capture time per batch size",
        "Replay latency p50 per batch size",
        "Replay latency p99 per batch size",
        "Replay latency p99 per rank",
        "Eager fallbacks per second",
        "Eager share of decode steps",
    }
)
NPU_ONLY_NOTE = " NPU only: empty where the engine runs without graphs (mode NONE, e.g. vLLM's CPU build)."
# Panels of spec.autoscaling: KEDA's HPA as kube-state-metrics exports it. KEDA names a resource's
# HPA keda-hpa-<resource> (kedacore/keda v2.20.2 controllers/keda/hpa.go getHPAName) and its first
# trigger's metric s0-prometheus (pkg/scalers/prometheus_scaler.go): the running-requests target.
KEDA_ONLY = frozenset({"Replicas: current, desired and max", "Running requests per replica and the target"})
KEDA_ONLY_NOTE = " Needs KEDA and kube-state-metrics: empty for resources without spec.autoscaling."
# Panels of spec.lora: the runtime exports its adapter series only with --lora-adapters.
LORA_ONLY = frozenset({"Requests per adapter", "Pods holding each adapter"})
LORA_ONLY_NOTE = " Needs spec.lora: empty for resources that serve no adapter."
# Panels of spec.cacheAwareRouting on a P/D resource: its routers' series (npu_runtime.routing).
CACHE_ONLY = frozenset({"Prefill choices by reason", "Prefix tokens saved per prefill engine"})
CACHE_ONLY_NOTE = " Needs spec.cacheAwareRouting on a P/D resource: empty for the others."
HPA = 'namespace=~"$namespace", horizontalpodautoscaler=~"keda-hpa-$npuinference"'
RUNNING_TARGET = ', metric_name="s0-prometheus", metric_target_type="average"'


def hpa(metric: str, extra: str = "") -> str:
    """A series of a resource's KEDA HPA, labelled with the resource's name as the pods' series are."""
    return (
        f'label_replace(kube_horizontalpodautoscaler_{metric}{{{HPA}{extra}}}, "inference_npu_dev_name", "$1", '
        '"horizontalpodautoscaler", "keda-hpa-(.+)")'
    )


Panel = dict[str, Any]


def target(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        result.update(instant=True, range=False, format="table")
    return result


def timeseries(title: str, description: str, targets: list[dict[str, Any]], unit: str) -> Panel:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}},
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def bargauge(title: str, description: str, targets: list[dict[str, Any]], unit: str) -> Panel:
    """Values that are set once per pod start (capture results): the latest value, one bar per series."""
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    }


def table(title: str, description: str, expr: str, hidden: list[str]) -> Panel:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [target(expr, instant=True)],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {"id": "organize", "options": {"excludeByName": dict.fromkeys(["Time", *hidden], True)}},
        ],
    }


def stat(title: str, description: str, targets: list[dict[str, Any]], unit: str = "none") -> Panel:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "value_and_name",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    }


def quantiles(metric: str, by: str, legend: str, *quantile_values: float) -> list[dict[str, Any]]:
    return [
        target(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}{{{SEL}}}[$__rate_interval])))",
            f"p{round(q * 100)} {legend}",
            ref=chr(ord("A") + index),
        )
        for index, q in enumerate(quantile_values)
    ]


# (row title, [(panel, width, height)]) in reading order; positions are computed by layout().
ROWS: list[tuple[str, list[tuple[Panel, int, int]]]] = [
    (
        "Graph mode",
        [
            (
                table(
                    "Effective graph mode",
                    "The mode each pod asked for (requested) and the mode the engine really runs "
                    "(effective), from npu_graph_mode_info.",
                    "max by (namespace, inference_npu_dev_name, pod, requested, effective) "
                    f"(npu_graph_mode_info{{{SEL}}})",
                    ["Value"],
                ),
                9,
                8,
            ),
            (
                table(
                    "Graph-mode downgrades",
                    "Every downgrade with its reason; stage=plan: the runtime's planner chose it, "
                    "stage=engine: vLLM or vllm-ascend changed the mode after the plan.",
                    "max by (namespace, inference_npu_dev_name, pod, stage, from_mode, to_mode, reason) "
                    f"(npu_graph_downgrades_total{{{SEL}}}) > 0",
                    [],
                ),
                10,
                8,
            ),
            (
                stat(
                    "Captured batch sizes",
                    "How many batch sizes were captured as graphs, per mode.",
                    [
                        target(
                            f"max by (inference_npu_dev_name, mode) (npu_graph_capture_sizes{{{SEL}}})",
                            "{{inference_npu_dev_name}} {{mode}}",
                        )
                    ],
                ),
                5,
                8,
            ),
        ],
    ),
    (
        "Graph capture",
        [
            (
                bargauge(
                    "Capture memory per batch size",
                    "Device memory one graph capture took (largest over the pod's devices).",
                    [
                        target(
                            f"max by (inference_npu_dev_name, mode, size) (npu_graph_capture_memory_bytes{{{SEL}}})",
                            "{{inference_npu_dev_name}} {{mode}} size {{size}}",
                        )
                    ],
                    "bytes",
                ),
                12,
                10,
            ),
            (
                bargauge(
                    "Capture time per batch size",
                    "Wall time one graph capture took.",
                    [
                        target(
                            f"max by (inference_npu_dev_name, mode, size) (npu_graph_capture_seconds{{{SEL}}})",
                            "{{inference_npu_dev_name}} {{mode}} size {{size}}",
                        )
                    ],
                    "s",
                ),
                12,
                10,
            ),
        ],
    ),
    (
        "Graph replay and eager fallbacks",
        [
            (
                timeseries(
                    "Replay latency p50 per batch size",
                    "Median device time of one graph replay.",
                    quantiles(
                        "npu_graph_replay_latency_seconds_bucket",
                        "inference_npu_dev_name, mode, size",
                        "{{inference_npu_dev_name}} {{mode}} size {{size}}",
                        0.5,
                    ),
                    "s",
                ),
                12,
                9,
            ),
            (
                timeseries(
                    "Replay latency p99 per batch size",
                    "99th percentile device time of one graph replay.",
                    quantiles(
                        "npu_graph_replay_latency_seconds_bucket",
                        "inference_npu_dev_name, mode, size",
                        "{{inference_npu_dev_name}} {{mode}} size {{size}}",
                        0.99,
                    ),
                    "s",
                ),
                12,
                9,
            ),
            (
                timeseries(
                    "Eager fallbacks per second",
                    "Decode steps that ran eagerly although graphs were on, by reason (e.g. a batch "
                    "size with no captured graph). Each is about 7x slower than a replay.",
                    [
                        target(
                            "sum by (inference_npu_dev_name, reason) "
                            f"(rate(npu_graph_eager_fallbacks_total{{{SEL}}}[$__rate_interval]))",
                            "{{inference_npu_dev_name}} {{reason}}",
                        )
                    ],
                    "ops",
                ),
                9,
                8,
            ),
            (
                timeseries(
                    "Eager share of decode steps",
                    "Eager fallbacks over eager fallbacks plus timed graph replays (reads high when "
                    "the observer times only one replay in N).",
                    [
                        target(
                            "sum by (inference_npu_dev_name) "
                            f"(rate(npu_graph_eager_fallbacks_total{{{SEL}}}[$__rate_interval])) / ("
                            "sum by (inference_npu_dev_name) "
                            f"(rate(npu_graph_eager_fallbacks_total{{{SEL}}}[$__rate_interval])) + "
                            "sum by (inference_npu_dev_name) "
                            f"(rate(npu_graph_replay_latency_seconds_count{{{SEL}}}[$__rate_interval])))",
                            "{{inference_npu_dev_name}}",
                        )
                    ],
                    "percentunit",
                ),
                9,
                8,
            ),
            (
                bargauge(
                    "Decode batches by size",
                    "Share of decode steps per batch size in tokens (before padding) since the pods "
                    "started: the distribution the planner chooses capture sizes for (docs/planner.md, "
                    "sizes from traffic; the record it plans with decays, /status shows it). Counted "
                    "from the counters themselves, not their increase over the range: a size first "
                    "seen with all its steps has no increase in Prometheus' eyes.",
                    [
                        target(
                            f"sum by (size) (npu_graph_decode_batches_total{{{SEL}}}) / "
                            f"scalar(sum(npu_graph_decode_batches_total{{{SEL}}}))",
                            "{{size}}",
                            instant=True,
                        )
                    ],
                    "percentunit",
                ),
                12,
                8,
            ),
            (
                stat(
                    "Observer hooks disabled",
                    "Errors after which the graph observer disabled a hook instead of breaking the "
                    "engine; that hook's metrics are missing until the pod restarts. 0 for a "
                    "resource whose hooks all work.",
                    [
                        target(
                            f"sum by (inference_npu_dev_name, hook) (npu_graph_instrumentation_errors_total{{{SEL}}})"
                            " or on (inference_npu_dev_name) "
                            f"sum by (inference_npu_dev_name) (0 * npu_graph_mode_info{{{SEL}}})",
                            "{{inference_npu_dev_name}} {{hook}}",
                        )
                    ],
                ),
                6,
                8,
            ),
        ],
    ),
    (
        "Device memory",
        [
            (
                bargauge(
                    "Device memory plan (device=plan) and what the engine saw",
                    "Total, free, weights, KV cache and graphs: the planner's figures under "
                    "device=plan, the engine's own per device.",
                    [
                        target(
                            f"max by (inference_npu_dev_name, device, kind) (npu_device_memory_bytes{{{SEL}}})",
                            "{{inference_npu_dev_name}} device {{device}} {{kind}}",
                        )
                    ],
                    "bytes",
                ),
                12,
                10,
            ),
            (
                timeseries(
                    "Device memory over time",
                    "The same figures over time, per pod.",
                    [
                        target(
                            f"max by (pod, device, kind) (npu_device_memory_bytes{{{SEL}}})",
                            "{{pod}} {{device}} {{kind}}",
                        )
                    ],
                    "bytes",
                ),
                12,
                10,
            ),
        ],
    ),
    (
        "vLLM",
        [
            (
                timeseries(
                    "Time to first token",
                    "vLLM's own histogram (port 8000), p50 and p99.",
                    quantiles(
                        "vllm:time_to_first_token_seconds_bucket",
                        "inference_npu_dev_name",
                        "{{inference_npu_dev_name}}",
                        0.5,
                        0.99,
                    ),
                    "s",
                ),
                8,
                9,
            ),
            (
                timeseries(
                    "Inter-token latency",
                    "vLLM's own histogram, p50 and p99: the decode steps graphs speed up.",
                    quantiles(
                        "vllm:inter_token_latency_seconds_bucket",
                        "inference_npu_dev_name",
                        "{{inference_npu_dev_name}}",
                        0.5,
                        0.99,
                    ),
                    "s",
                ),
                8,
                9,
            ),
            (
                timeseries(
                    "Requests running and waiting",
                    "vLLM's scheduler: requests in the batch and requests queued.",
                    [
                        target(
                            f"sum by (inference_npu_dev_name) (vllm:num_requests_running{{{SEL}}})",
                            "running {{inference_npu_dev_name}}",
                        ),
                        target(
                            f"sum by (inference_npu_dev_name) (vllm:num_requests_waiting{{{SEL}}})",
                            "waiting {{inference_npu_dev_name}}",
                            ref="B",
                        ),
                    ],
                    "short",
                ),
                8,
                9,
            ),
            (
                timeseries(
                    "KV cache usage",
                    "vLLM's KV cache usage per pod (1 = full).",
                    [
                        target(
                            f"max by (pod) (vllm:kv_cache_usage_perc{{{SEL}}})",
                            "{{pod}}",
                        )
                    ],
                    "percentunit",
                ),
                12,
                8,
            ),
            (
                timeseries(
                    "Generated tokens per second",
                    "vLLM's generation throughput.",
                    [
                        target(
                            "sum by (inference_npu_dev_name) "
                            f"(rate(vllm:generation_tokens_total{{{SEL}}}[$__rate_interval]))",
                            "{{inference_npu_dev_name}}",
                        )
                    ],
                    "short",
                ),
                12,
                8,
            ),
        ],
    ),
    (
        # The PodMonitors copy a LeaderWorkerSet pod's group and worker index into `group` and
        # `node_rank` (builders.RANK_TARGET_LABELS); a one-node replica's series have neither.
        "Multi-node replicas: per rank",
        [
            (
                timeseries(
                    "Replay latency p99 per rank",
                    "99th percentile device time of one graph replay, per group and node of a multi-node "
                    "replica (LeaderWorkerSet): one slow node holds its whole group back.",
                    quantiles(
                        "npu_graph_replay_latency_seconds_bucket",
                        "inference_npu_dev_name, group, node_rank, size",
                        "{{inference_npu_dev_name}} group {{group}} node {{node_rank}} size {{size}}",
                        0.99,
                    ),
                    "s",
                ),
                12,
                9,
            ),
            (
                table(
                    "Graph-mode downgrades per rank",
                    "Each downgrade with the group and node that made it (empty for one-node replicas): "
                    "a node can fall back alone, e.g. on an HCCL buffer or stream shortfall.",
                    "max by (namespace, inference_npu_dev_name, group, node_rank, pod, from_mode, to_mode, reason) "
                    f"(npu_graph_downgrades_total{{{SEL}}}) > 0",
                    [],
                ),
                12,
                9,
            ),
        ],
    ),
    (
        "Autoscaling",
        [
            (
                timeseries(
                    "Replicas: current, desired and max",
                    "spec.autoscaling: the replicas KEDA's HPA runs, asks for and may not exceed. Desired stuck at"
                    " max while the eager share grows: raise spec.autoscaling.maxReplicas." + KEDA_ONLY_NOTE,
                    [
                        target(
                            f"max by (inference_npu_dev_name) ({hpa('status_current_replicas')})",
                            "current {{inference_npu_dev_name}}",
                        ),
                        target(
                            f"max by (inference_npu_dev_name) ({hpa('status_desired_replicas')})",
                            "desired {{inference_npu_dev_name}}",
                            ref="B",
                        ),
                        target(
                            f"max by (inference_npu_dev_name) ({hpa('spec_max_replicas')})",
                            "max {{inference_npu_dev_name}}",
                            ref="C",
                        ),
                    ],
                    "short",
                ),
                12,
                8,
            ),
            (
                timeseries(
                    "Running requests per replica and the target",
                    "Running requests over the replicas KEDA's HPA counts, against the per-replica target the"
                    " operator took from the capture plan (status.autoscaling): above it, KEDA adds replicas."
                    + KEDA_ONLY_NOTE,
                    [
                        target(
                            f"sum by (inference_npu_dev_name) (vllm:num_requests_running{{{SEL}}})"
                            f" / on (inference_npu_dev_name) max by (inference_npu_dev_name) "
                            f"({hpa('status_current_replicas')})",
                            "per replica {{inference_npu_dev_name}}",
                        ),
                        target(
                            f"max by (inference_npu_dev_name) ({hpa('spec_target_metric', RUNNING_TARGET)})",
                            "target {{inference_npu_dev_name}}",
                            ref="B",
                        ),
                    ],
                    "short",
                ),
                12,
                8,
            ),
        ],
    ),
    (
        "LoRA adapters",
        [
            (
                timeseries(
                    "Requests per adapter",
                    "Requests per second for each LoRA adapter of spec.lora, counted by the runtime where vLLM "
                    "takes them in (OutputProcessor.add_request); the base model's requests are not counted here."
                    + LORA_ONLY_NOTE,
                    [
                        target(
                            f"sum by (adapter) (rate(npu_lora_requests_total{{{SEL}}}[$__rate_interval]))",
                            "{{adapter}}",
                        )
                    ],
                    "reqps",
                ),
                12,
                8,
            ),
            (
                bargauge(
                    "Pods holding each adapter",
                    "How many engine pods have each adapter loaded (npu_lora_adapter_loaded); one that failed "
                    "or is still fetching counts 0. status.adapters says why." + LORA_ONLY_NOTE,
                    [target(f"sum by (adapter) (npu_lora_adapter_loaded{{{SEL}}})", "{{adapter}}", instant=True)],
                    "none",
                ),
                12,
                8,
            ),
        ],
    ),
    (
        "Cache-aware routing",
        [
            (
                timeseries(
                    "Prefill choices by reason",
                    "Why the routers chose each prefill engine: cache (it held the prompt's prefix and was within "
                    "the load bound), load (a holder was slower), overloaded (a holder was past the bound), "
                    "new_prefix (no engine held it), no_tokens (the prompt's tokens were not known)." + CACHE_ONLY_NOTE,
                    [
                        target(
                            "sum by (reason) (rate(npu_router_choice_reasons_total"
                            f'{{{SEL}, role="prefill"}}[$__rate_interval]))',
                            "{{reason}}",
                        )
                    ],
                    "ops",
                ),
                12,
                8,
            ),
            (
                timeseries(
                    "Prefix tokens saved per prefill engine",
                    "Prompt tokens per second the routers expected each chosen engine to hold already (from its KV "
                    "events, or the prompts sent to it): the prefill it skips. vLLM's own "
                    "vllm:prefix_cache_hits_total on the engine is what it did skip." + CACHE_ONLY_NOTE,
                    [
                        target(
                            f"sum by (engine) (rate(npu_router_prefix_tokens_saved_total{{{SEL}}}[$__rate_interval]))",
                            "{{engine}}",
                        )
                    ],
                    "short",
                ),
                12,
                8,
            ),
        ],
    ),
    (
        "Operator",
        [
            (
                timeseries(
                    "Reconciles per second",
                    "The operator's reconciles of NPUInference resources, by result.",
                    [
                        target(
                            "sum by (result) (rate(npu_operator_reconciles_total[$__rate_interval]))",
                            "{{result}}",
                        )
                    ],
                    "ops",
                ),
                12,
                8,
            ),
            (
                timeseries(
                    "Reconcile duration p99",
                    "How long one reconcile takes, by result.",
                    [
                        target(
                            "histogram_quantile(0.99, sum by (result, le) "
                            "(rate(npu_operator_reconcile_duration_seconds_bucket[$__rate_interval])))",
                            "{{result}}",
                        )
                    ],
                    "s",
                ),
                12,
                8,
            ),
        ],
    ),
]


ALL_TITLES: list[str] = [panel["title"] for _, row in ROWS for panel, _, _ in row]


def layout(rows: list[tuple[str, list[tuple[Panel, int, int]]]]) -> list[Panel]:
    """Rows of panels, left to right, wrapping at the grid's width; ids in reading order."""
    panels: list[Panel] = []
    y = 0
    for title, row in rows:
        panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y},
            }
        )
        y += 1
        x, line_height = 0, 0
        for panel, width, height in row:
            if x + width > WIDTH:
                x, y, line_height = 0, y + line_height, 0
            if panel["title"] in NPU_ONLY:
                panel = {**panel, "description": panel["description"] + NPU_ONLY_NOTE}
            panels.append({**panel, "gridPos": {"h": height, "w": width, "x": x, "y": y}})
            x += width
            line_height = max(line_height, height)
        y += line_height
    for index, panel in enumerate(panels, start=1):
        panel["id"] = index
    return panels


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "NPU inference: graph mode, capture, replay, vLLM",
        "description": (
            "NPUInference resources on Ascend NPUs: the graph mode requested and run, downgrades, graph "
            "capture memory and time, replay latency, eager fallbacks, the device memory plan, vLLM's "
            "latency and queue, and the operator. Labels: namespace and inference_npu_dev_name (the pod "
            "label inference.npu.dev/name, copied by the PodMonitors' podTargetLabels); for the pods of a "
            "multi-node replica also group and node_rank (LeaderWorkerSet's group and worker index, "
            "relabeled by the PodMonitors). NPU only (empty "
            "where the engine runs without graphs, e.g. vLLM's CPU build): "
            + ", ".join(title for title in ALL_TITLES if title in NPU_ONLY)
            + ". The Autoscaling row needs KEDA (spec.autoscaling) and kube-state-metrics."
        ),
        "tags": ["npu", "ascend", "vllm", "npu-inference-operator"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "",
        "links": [],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                variable("namespace", "Namespace", "label_values(npu_graph_mode_info, namespace)"),
                variable(
                    "npuinference",
                    "NPUInference",
                    'label_values(npu_graph_mode_info{namespace=~"$namespace"}, inference_npu_dev_name)',
                ),
            ]
        },
        "panels": layout(ROWS),
        "version": 1,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(render(), encoding="utf-8")
    print(TARGET)
