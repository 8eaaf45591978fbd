"""spec.routing on a real cluster:
- what scrapes the endpoint picker, and on which port;
- how a gateway reaches the picker;
- how long a request through the route may take;
- what load the picker reads per pod;
- where the picker's config names its saturation detector.

Upstream rules are checked with cases taken from upstream's own tests, kept here as data (never
their code), each with its source:
- llm-d/llm-d-router v0.9.0 pkg/epp/framework/plugins/datalayer/extractor/metrics/spec_test.go
  (TestStringToMetricSpec, TestGetMetric): how the picker parses a metric spec and which series it
  reads for one;
- llm-d/llm-d-router v0.9.0 pkg/epp/config/loader/configloader_test.go TestLoadRawConfiguration
  (with testdata_test.go's config texts): where the saturation detector is read from, and when the
  loader reports a deprecation.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_operator.children import kinds, routing, scaling
from npu_operator.controller.desired import adopted_children, desired_state, read_spec

from tests.chart import monitoring
from tests.examples import example
from tests.operator import traffic_schemas

# The operator's admin allows the shared Gateway's namespace (the Restricted policy refuses others).
CONFIG = OperatorConfig(allowed_gateway_namespaces=("gateways",))
GATEWAY = {"name": "inference-gateway", "namespace": "gateways", "hostnames": ["qwen.inference.example.com"]}
UID = "11111111-2222-3333-4444-555555555555"
QWEN = "qwen2.5-7b-910b.yaml"  # one DP rank per pod, spec.metrics.podMonitor on
DEEPSEEK = "deepseek-r1-w8a8-2node.yaml"  # 4 DP ranks behind each leader's API server

# prometheus-operator v0.93.0 pkg/prometheus/promcfg.go generatePodMonitorConfig: the labels every
# target of a PodMonitor gets (namespace, container, pod from the pod's metadata; job; endpoint, the port).
POD_MONITOR_TARGET_LABELS = frozenset({"namespace", "container", "pod", "job", "endpoint"})
# llm-d-router v0.9.0 pkg/epp/metrics/llm_d_router_metrics.go llmdFlowControlQueueSize: subsystem
# LLMDRouterEndpointPickerSubsystem "llm_d_epp", name "flow_control_queue_size", labels
# {"fairness_id", "priority", "inference_pool"} + modelLabels (pkg/epp/metrics/metrics.go:
# "model_name", "target_model_name"); registered on controller-runtime's registry (metrics.go Register),
# which the manager's metrics server serves on --metrics-port (cmd/epp/runner/runner.go).
PICKER_QUEUE_SERIES = ("llm_d_epp_flow_control_queue_size", {"fairness_id", "priority", "inference_pool"})
PICKER_MODEL_LABELS = frozenset({"model_name", "target_model_name"})


def render(manifest: dict[str, Any], capabilities: kinds.Capabilities | None = None) -> list[dict[str, Any]]:
    manifest["metadata"].setdefault("uid", UID)
    spec, problems = read_spec(manifest, CONFIG)
    assert spec is not None and not problems, problems
    return adopted_children(manifest, spec, CONFIG, capabilities or kinds.Capabilities.everything())


def of_kind(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, [(o["kind"], o["metadata"]["name"]) for o in objects]
    return found[0]


def scaled_to_zero(name: str = QWEN) -> dict[str, Any]:
    manifest = example(name)
    manifest["spec"]["autoscaling"]["minReplicas"] = 0
    assert manifest["spec"]["metrics"]["podMonitor"]["enabled"], "spec.autoscaling requires it"
    return manifest


def flag(args: list[str], name: str) -> str:
    for index, arg in enumerate(args):
        if arg == name:
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise KeyError(name)


def picker_pod(objects: list[dict[str, Any]], resource: str) -> dict[str, Any]:
    template: dict[str, Any] = of_kind(objects, "Deployment", f"{resource}-epp")["spec"]["template"]
    return template


def monitors_of(objects: list[dict[str, Any]], pod_labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["kind"] == "PodMonitor" and o["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ]


def query_matchers(query: str) -> tuple[str, dict[str, str]]:
    found = re.fullmatch(r"sum\(([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\)", query)
    assert found, query
    return found.group(1), dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', found.group(2)))


# -- issue 2 and 6: what scrapes the picker, and on which port ---------------------------------------------


def test_a_resource_scaled_to_zero_has_its_pickers_held_requests_scraped() -> None:
    """The held-requests trigger reads the picker's flow-control gauge. Without a PodMonitor that
    selects the picker's pods on the port that serves /metrics, Prometheus has no such series and
    KEDA (ignoreNullValues) reads 0 for ever: a resource at zero replicas never wakes up."""
    objects = render(scaled_to_zero())
    pod = picker_pod(objects, "qwen25-7b")
    monitors = monitors_of(objects, pod["metadata"]["labels"])
    assert len(monitors) == 1, "exactly one PodMonitor selects the picker's pods (two would double the sum)"
    monitor = monitors[0]
    monitoring.validate(monitor)
    assert monitor["metadata"]["namespace"] == "llm"
    container = pod["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    metrics_port = int(flag(container["args"], "--metrics-port"))
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        # Only the port where the picker serves /metrics; grpc (ext-proc) and grpc-health serve gRPC only.
        assert ports[endpoint["port"]] == metrics_port, endpoint
        assert endpoint.get("path", "/metrics") == "/metrics"
        assert endpoint.get("scheme", "http") == "http", "controller-runtime's metrics server, plain HTTP"

    # The trigger's query selects on labels the scraped series really carry, with the values they carry.
    scaled = next(o for o in objects if o["kind"] == "ScaledObject")
    held = next(t for t in scaled["spec"]["triggers"] if t["name"] == "held-requests")
    metric, matchers = query_matchers(held["metadata"]["query"])
    name, own = PICKER_QUEUE_SERIES
    assert metric == name == scaling.PICKER_QUEUE_METRIC
    assert set(matchers) <= own | PICKER_MODEL_LABELS | POD_MONITOR_TARGET_LABELS
    assert matchers["namespace"] == monitor["metadata"]["namespace"]
    assert matchers["inference_pool"] == flag(container["args"], "--pool-name")


def test_every_pod_monitor_scrapes_only_ports_that_serve_metrics() -> None:
    """A target on a port without /metrics is down for ever (and alerts on it)."""
    for manifest in (scaled_to_zero(), scaled_to_zero(DEEPSEEK)):
        objects = render(manifest)
        resource = manifest["metadata"]["name"]
        pod = picker_pod(objects, resource)
        container = pod["spec"]["containers"][0]
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        for monitor in monitors_of(objects, pod["metadata"]["labels"]):
            assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
        assert ports["metrics"] == int(flag(container["args"], "--metrics-port"))
        # The picker's Service exposes the same port for a ServiceMonitor of your own.
        service = of_kind(objects, "Service", f"{resource}-epp")
        assert {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"} in service["spec"]["ports"]


@pytest.mark.parametrize(
    ("pod_monitor", "autoscaling", "served", "made"),
    [
        (True, True, True, True),  # monitoring asked for (autoscaling requires it): the picker too
        (True, False, True, True),
        (False, False, True, False),  # not asked for: no PodMonitor the user did not ask for
        (True, True, False, False),  # no PodMonitor API: nothing to make
    ],
)
def test_the_pickers_pod_monitor_follows_the_resources_monitoring(
    pod_monitor: bool, autoscaling: bool, served: bool, made: bool
) -> None:
    manifest = example(QWEN)
    if not autoscaling:
        del manifest["spec"]["autoscaling"]
    asked = {"enabled": pod_monitor, "interval": "15s", "labels": {"release": "kps"}}
    manifest["spec"]["metrics"]["podMonitor"] = asked
    capabilities = kinds.Capabilities(pod_monitor=served, scaled_object=True, inference_pool=True)
    objects = render(manifest, capabilities)
    monitors = [o for o in objects if o["kind"] == "PodMonitor" and o["metadata"]["name"] == "qwen25-7b-epp"]
    assert len(monitors) == int(made)
    if made:
        monitor = monitors[0]
        assert monitor["metadata"]["labels"]["release"] == "kps", "found by the same podMonitorSelector"
        assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"


def test_without_the_inference_pool_api_the_pickers_monitor_is_skipped_silently() -> None:
    manifest = scaled_to_zero()
    manifest["metadata"]["uid"] = UID
    desired = desired_state(manifest, CONFIG, frozenset({"PodMonitor", "ScaledObject"}))
    assert "PodMonitor-epp" not in desired.manifests
    assert desired.notes == ("InferencePool not managed: the inference.networking.k8s.io/v1 API is not installed",)
    served = desired_state(manifest, CONFIG, frozenset({"PodMonitor", "ScaledObject", "InferencePool"}))
    assert "PodMonitor-epp" in served.manifests


# -- issue 4: TLS between the gateway and the picker ---------------------------------------------------------


def test_the_picker_serves_tls_and_its_service_does_not_claim_cleartext() -> None:
    """kgateway and Envoy AI Gateway dial the picker with TLS (no verification); Istio speaks what the
    Service and a DestinationRule tell it. A port that says cleartext HTTP/2 (`http2`, `kubernetes.io/h2c`)
    in front of a TLS server fails every request on Istio, and with FailClose every request of the route."""
    objects = render(example(QWEN))
    container = picker_pod(objects, "qwen25-7b")["spec"]["containers"][0]
    # options.go: --secure-serving defaults to true; written out so that an upstream change shows here.
    assert flag(container["args"], "--secure-serving") == "true"
    service = of_kind(objects, "Service", "qwen25-7b-epp")
    ref = of_kind(objects, "InferencePool", "qwen25-7b")["spec"]["endpointPickerRef"]
    grpc = next(port for port in service["spec"]["ports"] if port["port"] == ref["port"]["number"])
    assert grpc.get("appProtocol") not in ("http", "http2", "kubernetes.io/h2c", "h2c")
    assert int(flag(container["args"], "--grpc-port")) == ref["port"]["number"]


def test_on_istio_a_destination_rule_makes_its_proxies_speak_tls_to_the_picker() -> None:
    objects = render(example(QWEN))
    rule = of_kind(objects, "DestinationRule", "qwen25-7b-epp")
    traffic_schemas.validate_destination_rule(rule)
    service = of_kind(objects, "Service", "qwen25-7b-epp")
    ref = of_kind(objects, "InferencePool", "qwen25-7b")["spec"]["endpointPickerRef"]
    assert rule["metadata"]["namespace"] == service["metadata"]["namespace"]
    # A short host is the Service of that name in the rule's namespace (destination_rule.proto, `host`).
    assert rule["spec"]["host"] == service["metadata"]["name"] == ref["name"]
    assert "exportTo" not in rule["spec"], "the gateway's proxies run in another namespace"
    assert rule["spec"]["trafficPolicy"] == {
        "portLevelSettings": [
            {"port": {"number": ref["port"]["number"]}, "tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}
        ]
    }


def test_without_istio_no_destination_rule_and_no_note() -> None:
    manifest = example(QWEN)
    manifest["metadata"]["uid"] = UID
    apis = {"PodMonitor", "ScaledObject", "InferencePool", "HTTPRoute"}
    plain = desired_state(manifest, CONFIG, frozenset(apis))
    assert "DestinationRule-epp" not in plain.manifests
    assert not [note for note in plain.notes if "DestinationRule" in note], "kgateway and Envoy users need none"
    istio = desired_state(manifest, CONFIG, frozenset(apis | {"DestinationRule"}))
    assert "DestinationRule-epp" in istio.manifests
    assert {k: v for k, v in istio.manifests.items() if k != "DestinationRule-epp"} == dict(plain.manifests)


# -- issue 7: the route's timeouts ---------------------------------------------------------------------------


def routed(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["spec"]["routing"]["gateway"] = GATEWAY
    route = of_kind(render(manifest), "HTTPRoute", manifest["metadata"]["name"])
    traffic_schemas.validate_http_route(route)
    timeouts: dict[str, Any] = route["spec"]["rules"][0]["timeouts"]
    return timeouts


def test_the_route_lets_a_long_completion_finish() -> None:
    """Without timeouts a gateway applies its own default (Envoy's route timeout: 15 s) and cuts a long completion."""
    timeouts = routed(example(QWEN))
    assert timeouts == {"request": "10m", "backendRequest": "10m"}  # requestTimeoutSeconds' default, 600


def test_with_scale_to_zero_the_route_also_waits_for_a_replica_to_start() -> None:
    manifest = scaled_to_zero()
    manifest["spec"]["routing"]["requestTimeoutSeconds"] = 900
    manifest["spec"]["engine"]["startupTimeoutSeconds"] = 2400
    manifest["spec"]["autoscaling"]["pollingIntervalSeconds"] = 30
    timeouts = routed(manifest)
    # One completion on a pod; the whole exchange adds KEDA's polling interval and a replica's startup.
    assert traffic_schemas.duration(timeouts["backendRequest"]) == 900
    assert traffic_schemas.duration(timeouts["request"]) == 900 + 30 + 2400
    assert timeouts == {"request": "55m30s", "backendRequest": "15m"}


@given(seconds=st.integers(1, 86400 + 86400 + 3600))
@settings(max_examples=200, deadline=None)
def test_every_timeout_is_a_gateway_api_duration_of_the_same_length(seconds: int) -> None:
    text = routing.gateway_duration(seconds)
    assert re.fullmatch(r"([0-9]{1,5}(h|m|s|ms)){1,4}", text)
    assert traffic_schemas.duration(text) == seconds


@pytest.mark.parametrize(("value", "valid"), [(0, False), (1, True), (600, True), (86400, True), (86401, False)])
def test_the_request_timeout_field_is_bounded(value: int, valid: bool) -> None:
    manifest = example(QWEN)
    manifest["spec"]["routing"]["requestTimeoutSeconds"] = value
    errors = [e for e in crd.validate(manifest) if "requestTimeoutSeconds" in e]
    assert (not errors) == valid, errors


# -- issue 8: the load of every DP rank behind one API server ------------------------------------------------

# spec_test.go TestStringToMetricSpec: (input, (name, labels) or None for the nil spec, or "error").
SPEC_CASES: list[tuple[str, Any]] = [
    ("", None),
    ("my_metric", ("my_metric", {})),
    ("my_metric{label1=value1}", ("my_metric", {"label1": "value1"})),
    ('my_metric{label1="value1"}', ("my_metric", {"label1": "value1"})),
    ("my_metric{label1=value1,label2=value2}", ("my_metric", {"label1": "value1", "label2": "value2"})),
    (
        "  my_metric  {  label1  =  value1  ,  label2  =  value2  }  ",
        ("my_metric", {"label1": "value1", "label2": "value2"}),
    ),
    ("my_metric{label1=value1", "error"),
    ("my_metriclabel1=value1}", "error"),
    ("my_metric{label1}", "error"),
    ("my_metric{=value1}", "error"),
    ("my_metric{label1=}", "error"),
    ("my_metric{  =  }", "error"),
    ("my_metric{label=val}extra", "error"),
    ("{label=val}", "error"),
    ("my_metric ", ("my_metric", {})),
    ("  my_metric  ", ("my_metric", {})),
]

# spec_test.go TestGetMetric: its metric families (labels, value, timestamp in ms) and cases
# (name, labels, value read or "error").
FAMILIES: dict[str, list[tuple[dict[str, str], float, int | None]]] = {
    "metric1": [({"label1": "value1"}, 1.0, 1000), ({"label1": "value2"}, 2.0, 2000)],
    "metric2": [({"labelA": "A1", "labelB": "B1"}, 3.0, 1500), ({"labelA": "A2", "labelB": "B2"}, 4.0, 2500)],
    "metric3": [({}, 5.0, 3000), ({}, 6.0, 1000)],
    "empty_metric": [],
}
GET_CASES: list[tuple[str, dict[str, str], Any]] = [
    ("metric1", {"label1": "value1"}, 1.0),  # get labeled metric, exists
    ("metric1", {"label1": "value3"}, "error"),  # wrong value
    ("metric1", {"label2": "value2"}, "error"),  # missing label
    ("metric2", {"labelA": "A1"}, 3.0),  # extra label present
    ("metric3", {}, 5.0),  # unlabeled metric: the latest
    ("metric4", {}, "error"),  # metric family not found
    ("metric4", {"label1": "value1"}, "error"),  # labeled, family not found
    ("empty_metric", {}, "error"),  # no metrics available
]


@pytest.mark.parametrize(("text", "expected"), SPEC_CASES)
def test_the_model_of_the_pickers_metric_specs_agrees_with_its_tests(text: str, expected: Any) -> None:
    if expected == "error":
        with pytest.raises(ValueError, match="specification"):
            traffic_schemas.metric_spec(text)
    else:
        assert traffic_schemas.metric_spec(text) == expected


@pytest.mark.parametrize(("name", "labels", "expected"), GET_CASES)
def test_the_model_of_the_series_the_picker_reads_agrees_with_its_tests(
    name: str, labels: dict[str, str], expected: Any
) -> None:
    if expected == "error":
        with pytest.raises(LookupError):
            traffic_schemas.latest_sample((name, labels), FAMILIES)
    else:
        assert traffic_schemas.latest_sample((name, labels), FAMILIES) == expected


def exposition(ranks: dict[str, tuple[int, int, float]]) -> dict[str, list[tuple[dict[str, str], float, int | None]]]:
    """A serving pod's /metrics as the picker parses it: vLLM's gauges, one series per engine (DP rank,
    no timestamps), and the series the runtime adds over all of them."""
    families: dict[str, list[tuple[dict[str, str], float, int | None]]] = {}
    for engine, (waiting, running, kv) in ranks.items():
        labels = {"model_name": "deepseek-ai/DeepSeek-R1", "engine": engine}
        families.setdefault("vllm:num_requests_waiting", []).append((labels, waiting, None))
        families.setdefault("vllm:num_requests_running", []).append((labels, running, None))
        families.setdefault("vllm:kv_cache_usage_perc", []).append((labels, kv, None))
    model = {"model_name": "deepseek-ai/DeepSeek-R1"}
    families[routing.DP_WAITING_METRIC] = [(model, float(sum(r[0] for r in ranks.values())), None)]
    families[routing.DP_RUNNING_METRIC] = [(model, float(sum(r[1] for r in ranks.values())), None)]
    families[routing.DP_KV_USAGE_METRIC] = [(model, sum(r[2] for r in ranks.values()) / len(ranks), None)]
    return families


def engine_specs(config: dict[str, Any]) -> dict[str, str]:
    """The specs the extractor uses for a pod without the engine-type label (ours): defaultEngine's."""
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    params = extractor.get("parameters", {})
    default = params.get("defaultEngine", "vllm")
    configured = {engine["name"]: engine for engine in params.get("engineConfigs", [])}
    # factories.go defaultEngineConfigs["vllm"], used unless configured under that name.
    vllm = {
        "queuedRequestsSpec": "vllm:num_requests_waiting",
        "runningRequestsSpec": "vllm:num_requests_running",
        "kvUsageSpec": "vllm:kv_cache_usage_perc",
    }
    return dict(configured.get(default, vllm if default == "vllm" else {}))


def picker_config(objects: list[dict[str, Any]], resource: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        of_kind(objects, "ConfigMap", f"{resource}-epp")["data"][routing.PICKER_CONFIG_FILE]
    )
    traffic_schemas.validate_picker_config(config)
    return config


def test_the_picker_reads_the_load_of_every_dp_rank_behind_a_pod() -> None:
    """vLLM writes one series per DP rank; the picker reads the first. A pod with 4 ranks whose rank 0
    is idle while the others queue would look idle to the queue and KV-cache scorers."""
    config = picker_config(render(example(DEEPSEEK)), "deepseek-r1")
    specs = engine_specs(config)
    pod = exposition({"0": (0, 2, 0.10), "1": (7, 16, 0.90), "2": (5, 16, 0.80), "3": (4, 16, 0.60)})
    read = {
        key: traffic_schemas.latest_sample(spec, pod)
        for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")
        if (spec := traffic_schemas.metric_spec(specs[key])) is not None
    }
    assert read["queuedRequestsSpec"] == 16, "every rank's waiting requests"
    assert read["runningRequestsSpec"] == 50, "every rank's running requests"
    assert read["kvUsageSpec"] == pytest.approx(0.60), "the pod's KV blocks in use, over all ranks"


def test_with_one_dp_rank_per_pod_the_picker_reads_vllms_own_series() -> None:
    config = picker_config(render(example(QWEN)), "qwen25-7b")
    assert engine_specs(config)["queuedRequestsSpec"] == "vllm:num_requests_waiting"
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    assert "parameters" not in extractor, "llm-d's defaults: exact for one rank, nothing the runtime must add"


# -- issue 9b: where the config names its saturation detector ------------------------------------------------

# configloader_test.go TestLoadRawConfiguration: the cases that involve the saturation detector or a
# deprecation (config fields of testdata_test.go's texts that matter here; the detector the loaded
# config's flowControl.saturationDetector names; whether the case expects a deprecation). The last case
# is the rule the deprecated field's own comment states (endpointpickerconfig_types.go: "If both are
# set, the new field is used"), which LoadRawConfig implements; no upstream test case has both.
LOADER_CASES: list[tuple[str, dict[str, Any], str | None, bool]] = [
    (
        "Success - Full Configuration",
        {
            "apiVersion": "llm-d.ai/v1alpha1",
            "flowControl": {"saturationDetector": {"pluginRef": "utilization-detector"}},
        },
        "utilization-detector",
        False,
    ),
    (
        "Success - using deprecated Groupname",
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "flowControl": {"saturationDetector": {"pluginRef": "utilization-detector"}},
        },
        "utilization-detector",
        True,
    ),
    ("Success - No Profiles", {"apiVersion": "llm-d.ai/v1alpha1"}, None, False),
    (
        "Success - Deprecated Top-level SaturationDetector",
        {"apiVersion": "llm-d.ai/v1alpha1", "saturationDetector": {"pluginRef": "utilization-detector"}},
        "utilization-detector",
        True,
    ),
    (
        "Success - Deprecated Top-level Parser",
        {"apiVersion": "llm-d.ai/v1alpha1", "parser": {"pluginRef": "openai-parser"}},
        None,
        True,
    ),
    (
        "both set: the new field is used",
        {
            "apiVersion": "llm-d.ai/v1alpha1",
            "saturationDetector": {"pluginRef": "old-detector"},
            "flowControl": {"saturationDetector": {"pluginRef": "new-detector"}},
        },
        "new-detector",
        True,
    ),
]


@pytest.mark.parametrize(("case", "config", "detector", "deprecated"), LOADER_CASES, ids=[c[0] for c in LOADER_CASES])
def test_the_model_of_the_config_loader_agrees_with_its_tests(
    case: str, config: dict[str, Any], detector: str | None, deprecated: bool
) -> None:
    assert traffic_schemas.effective_saturation_detector(config) == detector
    assert bool(traffic_schemas.deprecations(config)) == deprecated


@pytest.mark.parametrize("name", [QWEN, DEEPSEEK])
def test_the_picker_config_names_its_detector_under_flow_control(name: str) -> None:
    manifest = example(name)
    config = picker_config(render(manifest), manifest["metadata"]["name"])
    assert traffic_schemas.deprecations(config) == [], "the picker would log a DEPRECATION line at every start"
    assert traffic_schemas.effective_saturation_detector(config) == routing.DETECTOR


# -- issue 47: LoRA adapters, scored by the picker -----------------------------------------------------------

# loraaffinity/lora_affinity_test.go TestLoraAffinityScorer: (case, target model, endpoints as
# {pod: (ActiveModels, WaitingModels, MaxActiveModels)}, expected score per pod).
LoraEndpoints = dict[str, tuple[set[str], set[str], int]]
LORA_SCORER_CASES: list[tuple[str, str, LoraEndpoints, dict[str, float]]] = [
    ("Target model is active", "active-model-1", {"pod1": ({"active-model-1"}, set(), 5)}, {"pod1": 1.0}),
    (
        "Target model is waiting",
        "active-model-1",
        {"pod1": ({"active-model-2"}, {"active-model-1"}, 2)},
        {"pod1": 0.6},
    ),
    (
        "Endpoints have no space for new model",
        "active-model-1",
        {"pod1": ({"active-model-2"}, {"active-model-3"}, 2), "pod2": (set(), set(), 0)},
        {"pod1": 0.0, "pod2": 0.0},
    ),
    (
        "Multipleendpoints with mixed active and waiting models",
        "active-model-1",
        {
            "pod1": ({"active-model-1"}, set(), 5),
            "pod2": ({"active-model-2"}, {"active-model-1"}, 5),
            "pod3": ({"active-model-2"}, set(), 2),
            "pod4": ({"active-model-3"}, {"active-model-1"}, 2),
            "pod5": ({"active-model-4", "active-model-5"}, set(), 2),
        },
        {"pod1": 1.0, "pod2": 0.8, "pod3": 0.8, "pod4": 0.6, "pod5": 0.0},
    ),
    ("Empty pods slice", "modelA", {}, {}),
]

# datalayer/extractor/metrics/spec_test.go TestGetLoRAMetric: the `vllm:lora_requests_info` series
# (labels, value: the time vLLM set it) and the adapters and max_lora the extractor reads (None: none).
LoraSeries = list[tuple[dict[str, str], float]]
LORA_SERIES_CASES: list[tuple[str, dict[str, LoraSeries], tuple[set[str], int] | None]] = [
    ("missing family treated as no adapters", {"some_other_metric": [({}, 1.0)]}, None),
    (
        "basic lora metrics",
        {
            "vllm:lora_requests_info": [
                ({"running_lora_adapters": "lora1", "max_lora": "2"}, 3000.0),
                ({"running_lora_adapters": "lora2,lora3", "max_lora": "4"}, 1000.0),
            ]
        },
        ({"lora1"}, 2),
    ),
    ("no matching lora metrics", {"vllm:lora_requests_info": [({"other_label": "value"}, 5.0)]}, (set(), 0)),
]


def lora_affinity_score(target: str, active: set[str], waiting: set[str], max_active: int) -> float:
    """lora_affinity.go LoraAffinityScorer.Score for one endpoint."""
    if target in active:
        return 1.0
    if len(active) + len(waiting) < max_active:
        return 0.8
    return 0.6 if target in waiting else 0.0


def lora_info(families: dict[str, LoraSeries], name: str = "vllm:lora_requests_info") -> tuple[set[str], int] | None:
    """What the extractor reads of the LoRA gauge: the series with the largest value (loraspec.go
    LoRASpec.getLatestMetric; none when the family is missing), its adapters (running and waiting, as
    spec_test.go collects them: extractor.go addAdapters splits on commas) and max_lora."""
    series = families.get(name, [])
    if not series:
        return None
    labels, _ = max(series, key=lambda item: item[1])
    adapters = {
        adapter.strip()
        for key in ("running_lora_adapters", "waiting_lora_adapters")
        for adapter in labels.get(key, "").split(",")
        if adapter.strip()
    }
    return adapters, int(labels.get("max_lora") or 0)


@pytest.mark.parametrize(
    ("case", "target", "endpoints", "expected"), LORA_SCORER_CASES, ids=[c[0] for c in LORA_SCORER_CASES]
)
def test_the_model_of_the_lora_affinity_scorer_agrees_with_its_tests(
    case: str, target: str, endpoints: LoraEndpoints, expected: dict[str, float]
) -> None:
    assert {pod: lora_affinity_score(target, *metrics) for pod, metrics in endpoints.items()} == expected


@pytest.mark.parametrize(("case", "families", "expected"), LORA_SERIES_CASES, ids=[c[0] for c in LORA_SERIES_CASES])
def test_the_model_of_the_lora_series_the_picker_reads_agrees_with_its_tests(
    case: str, families: dict[str, LoraSeries], expected: tuple[set[str], int] | None
) -> None:
    assert lora_info(families) == expected


def lora_scorers(config: dict[str, Any]) -> list[Any]:
    [profile] = config["schedulingProfiles"]
    plugins = [p for p in config["plugins"] if p["type"] == routing.LORA_SCORER]
    refs = [(r["pluginRef"], r.get("weight")) for r in profile["plugins"] if r["pluginRef"] == routing.LORA_SCORER]
    return [plugins, refs]


# factories.go defaultEngineConfigs, engine "vllm": its LoRASpec, used for a pod the config names no other for.
VLLM_LORA_SPEC = "vllm:lora_requests_info"


@pytest.mark.parametrize("data_parallel", [1, 4])
def test_with_lora_adapters_the_picker_scores_each_pod_by_the_requested_adapter(data_parallel: int) -> None:
    config = routing.picker_config(16, data_parallel, lora=True)
    traffic_schemas.validate_picker_config(config)
    assert lora_scorers(config) == [[{"type": routing.LORA_SCORER}], [(routing.LORA_SCORER, routing.LORA_WEIGHT)]]
    # What the scorer reads comes from the extractor's LoRA spec for our pods: vLLM's own gauge.
    extractor = next(p for p in config["plugins"] if p["type"] == routing.EXTRACTOR)
    params = extractor.get("parameters", {})
    configured = {engine["name"]: engine for engine in params.get("engineConfigs", [])}
    default = params.get("defaultEngine", "vllm")
    assert configured.get(default, {"loraSpec": VLLM_LORA_SPEC})["loraSpec"] == "vllm:lora_requests_info"
    # A pod whose batch runs "sql" wins a tie against one that must swap it into a full set of slots...
    gauge = "vllm:lora_requests_info"
    running = lora_info({gauge: [({"running_lora_adapters": "sql,chat", "max_lora": "2"}, 9.0)]})
    full = lora_info({gauge: [({"running_lora_adapters": "a,b", "max_lora": "2"}, 9.0)]})
    assert running is not None and full is not None
    assert lora_affinity_score("sql", running[0], set(), running[1]) == 1.0
    assert lora_affinity_score("sql", full[0], set(), full[1]) == 0.0
    # ...but never outweighs a load scorer: its whole range is below either one's weight.
    [profile] = config["schedulingProfiles"]
    weights = {ref["pluginRef"]: ref.get("weight", 1) for ref in profile["plugins"]}
    assert weights[routing.LORA_SCORER] * 1.0 < min(weights["queue-scorer"], weights["kv-cache-utilization-scorer"])


def test_without_lora_adapters_the_pickers_config_is_as_before() -> None:
    with_lora = routing.picker_config(16, lora=True)
    with_lora["plugins"] = [p for p in with_lora["plugins"] if p["type"] != routing.LORA_SCORER]
    [profile] = with_lora["schedulingProfiles"]
    profile["plugins"] = [r for r in profile["plugins"] if r["pluginRef"] != routing.LORA_SCORER]
    assert routing.picker_config(16) == with_lora
    assert lora_scorers(routing.picker_config(16)) == [[], []]
    assert routing.Pool("r", "ns", {}, {"a": "b"}, 16, "FailClose").lora is False


def test_the_pool_s_lora_flag_reaches_the_pickers_config_map_but_not_behind_a_router() -> None:
    def rendered(**fields: Any) -> dict[str, Any]:
        pool = routing.Pool("r", "ns", {}, {"a": "b"}, 16, "FailClose", **fields)
        [config_map] = [o for o in routing.build_picker(pool, "epp:v0.9.0") if o["kind"] == "ConfigMap"]
        config: dict[str, Any] = yaml.safe_load(config_map["data"][routing.PICKER_CONFIG_FILE])
        traffic_schemas.validate_picker_config(config)
        return config

    assert lora_scorers(rendered(lora=True))[1] == [(routing.LORA_SCORER, routing.LORA_WEIGHT)]
    assert lora_scorers(rendered())[1] == []
    # The routers hold no adapter and export no vLLM LoRA gauge: the scorer would score every one 0.
    assert rendered(lora=True, behind_router=True) == rendered(behind_router=True)
    assert lora_scorers(rendered(lora=True, behind_router=True)) == [[], []]


def test_a_resource_with_lora_adapters_gets_the_scorer_in_its_picker_and_its_routers_do_not() -> None:
    config = picker_config(render(example("qwen2.5-7b-lora.yaml")), "qwen25-7b-lora")
    assert lora_scorers(config)[1] == [(routing.LORA_SCORER, routing.LORA_WEIGHT)]
    assert lora_scorers(picker_config(render(example(QWEN)), "qwen25-7b"))[1] == []
    plain, pd = example("deepseek-r1-w8a8-pd.yaml"), example("deepseek-r1-w8a8-pd.yaml")
    plain["spec"]["routing"] = pd["spec"]["routing"] = {}
    pd["spec"]["lora"] = {"maxLoras": 2, "maxLoraRank": 16}
    name = pd["metadata"]["name"]
    assert picker_config(render(pd), name) == picker_config(render(plain), name), "the routers hold no adapter"
