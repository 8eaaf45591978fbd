"""spec.autoscaling and spec.routing: targets from the plan, and the ScaledObject, InferencePool, HTTPRoute and
endpoint picker objects checked against their projects' published schemas (tests/operator/traffic_schemas.py)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from npu_operator.api import crd
from npu_operator.api import spec as api_spec
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import AutoscalingSpec, parse_spec
from npu_operator.children import kinds, routing, scaling
from npu_operator.children import kinds as children
from npu_operator.controller.desired import adopted_children, desired_state, read_spec
from npu_operator.kube import names
from npu_operator.status.resource import Observed, compute_status
from npu_runtime.contract import PlanOptions
from npu_runtime.planner.capture_candidates import largest_decode_batch
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.probe import DeviceInfo

from tests.examples import example
from tests.operator import traffic_schemas
from tests.runtime.planner.test_plan_properties import PROPERTY_SETTINGS, cases, try_plan

# The operator's admin allows the shared Gateway's namespace (the Restricted policy refuses others).
CONFIG = OperatorConfig(
    allowed_gateway_namespaces=("gateways",), allowed_prometheus_addresses=("https://prometheus.example.com",)
)
GATEWAY = {"name": "inference-gateway", "namespace": "gateways", "hostnames": ["qwen.inference.example.com"]}
KUBERNETES_VERSION = "1.37.0"
UID = "11111111-2222-3333-4444-555555555555"
QWEN = "qwen2.5-7b-910b.yaml"
DEEPSEEK = "deepseek-r1-w8a8-2node.yaml"


def render(manifest: dict[str, Any], capabilities: kinds.Capabilities | None = None) -> list[dict[str, Any]]:
    manifest["metadata"].setdefault("uid", UID)
    spec, problems = read_spec(manifest, CONFIG)
    assert spec is not None and not problems, problems
    return adopted_children(manifest, spec, CONFIG, capabilities or kinds.Capabilities.everything())


def of_kind(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, [(o["kind"], o["metadata"]["name"]) for o in objects]
    return found[0]


def autoscaled(name: str, **autoscaling: Any) -> dict[str, Any]:
    manifest = example(name)
    manifest["spec"]["autoscaling"] = {"maxReplicas": 4, **autoscaling}
    return manifest


# -- the examples ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "batch", "ranks", "target"),
    [
        # max_num_seqs 48, no speculative decoding: the plan captures up to 48; 80% of 48 x 1 = 38.
        (QWEN, 48, 1, 38),
        # max_num_seqs 16, MTP 3 tokens: the ceiling 16 x 4 = 64 tokens is 16 requests; 80% of 16 x 4 DP = 51.
        (DEEPSEEK, 16, 4, 51),
    ],
)
def test_the_examples_scale_on_targets_from_their_plans(name: str, batch: int, ranks: int, target: int) -> None:
    manifest = example(name)
    assert "autoscaling" in manifest["spec"] and "routing" in manifest["spec"], "the example shows both"
    objects = render(manifest)
    scaled = of_kind(objects, "ScaledObject")
    traffic_schemas.validate_scaled_object(scaled)
    thresholds = {t["name"]: t["metadata"]["threshold"] for t in scaled["spec"]["triggers"]}
    assert thresholds == {"running-requests": str(target), "waiting-requests": str(target)}
    resource = manifest["metadata"]["name"]
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": resource}

    pool = of_kind(objects, "InferencePool")
    traffic_schemas.validate_inference_pool(pool)
    config = yaml.safe_load(of_kind(objects, "ConfigMap")["data"][routing.PICKER_CONFIG_FILE])
    traffic_schemas.validate_picker_config(config)
    detector = next(p for p in config["plugins"] if p["type"] == "concurrency-detector")
    # No pod is sent more than it decodes in a graph: the largest captured batch x the DP ranks behind it.
    assert detector["parameters"] == {"concurrencyMode": "requests", "maxConcurrency": batch * ranks, "headroom": 0}


def test_a_multi_node_pool_and_scale_selector_pick_the_leaders_only() -> None:
    """A replica of two nodes is one group: one leader serves its API and counts as the replica."""
    manifest = example(DEEPSEEK)
    objects = render(manifest)
    leaders = {**names.selector_labels("deepseek-r1"), names.LWS_WORKER_INDEX_LABEL: "0"}
    assert of_kind(objects, "InferencePool")["spec"]["selector"]["matchLabels"] == leaders
    assert of_kind(objects, "Service", "deepseek-r1")["spec"]["selector"] == leaders
    spec = parse_spec(manifest["spec"])
    status = compute_status("deepseek-r1", "llm", 1, spec, Observed(), {}, "2026-01-01T00:00:00Z")
    assert status["selector"] == ",".join(f"{k}={v}" for k, v in sorted(leaders.items()))
    # The scale subresource reads that selector, and counts replicas in groups (the LWS's replicas).
    assert crd.version_spec()["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    assert of_kind(objects, "LeaderWorkerSet")["spec"]["replicas"] == spec.replicas


def test_a_one_node_scale_selector_picks_every_pod() -> None:
    spec = parse_spec(example(QWEN)["spec"])
    status = compute_status("qwen25-7b", "llm", 1, spec, Observed(), {}, "2026-01-01T00:00:00Z")
    assert status["selector"] == names.selector_string("qwen25-7b")
    assert "worker-index" not in status["selector"]


def test_the_pickers_objects_are_valid_kubernetes_with_least_rbac() -> None:
    objects = render(example(QWEN))
    picker = "qwen25-7b-epp"
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"):
        kubernetes_validate.validate(of_kind(objects, kind, picker), KUBERNETES_VERSION, strict=True)
    role = of_kind(objects, "Role", picker)
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}, "read-only"
    assert not any(o["kind"] in ("ClusterRole", "ClusterRoleBinding") for o in objects)
    deployment = of_kind(objects, "Deployment", picker)
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["image"] == CONFIG.picker_image == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.9.0"
    assert traffic_schemas.picker_flags(container["args"]) <= traffic_schemas.PICKER_FLAGS
    assert container["args"][container["args"].index("--pool-name") + 1] == "qwen25-7b"
    assert pod["spec"]["serviceAccountName"] == picker
    # The picker's pods are not serving pods: no Service, PodMonitor, PDB or pool of the resource selects them.
    labels = pod["metadata"]["labels"]
    for selector in (
        of_kind(objects, "Service", "qwen25-7b")["spec"]["selector"],
        of_kind(objects, "InferencePool")["spec"]["selector"]["matchLabels"],
        of_kind(objects, "PodMonitor", "qwen25-7b")["spec"]["selector"]["matchLabels"],
    ):
        assert not selector.items() <= labels.items()
    # The pool points at the picker's Service and gRPC port.
    ref = of_kind(objects, "InferencePool")["spec"]["endpointPickerRef"]
    service = of_kind(objects, "Service", picker)
    assert ref["name"] == service["metadata"]["name"]
    assert ref["port"]["number"] in [port["port"] for port in service["spec"]["ports"]]


def test_an_http_route_attaches_the_pool_to_the_named_gateway() -> None:
    manifest = example(QWEN)
    manifest["spec"]["routing"]["gateway"] = GATEWAY
    route = of_kind(render(manifest), "HTTPRoute")
    traffic_schemas.validate_http_route(route)
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway", "namespace": "gateways"}
    ]
    assert route["spec"]["hostnames"] == ["qwen.inference.example.com"]  # only its own hosts, on a shared Gateway
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert backend == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen25-7b"}


def test_scale_to_zero_wakes_on_the_pickers_held_requests() -> None:
    manifest = example(QWEN)
    manifest["spec"]["autoscaling"]["minReplicas"] = 0
    scaled = of_kind(render(manifest), "ScaledObject")
    traffic_schemas.validate_scaled_object(scaled)
    assert scaled["spec"]["minReplicaCount"] == 0
    held = next(t for t in scaled["spec"]["triggers"] if t["name"] == "held-requests")
    query = 'sum(llm_d_epp_flow_control_queue_size{namespace="llm",inference_pool="qwen25-7b"})'
    assert held["metadata"]["query"] == query


# kedacore/keda v2.20.2, apis/keda/v1alpha1/scaledobject_webhook_test.go, "POLLINGINTERVAL WARNING TESTS",
# "COOLDOWNPERIOD WARNING TESTS" and "COMBINED WARNING TESTS": (minReplicaCount, idleReplicaCount,
# pollingInterval, cooldownPeriod, useCachedMetrics, the warnings expected).
POLLING = traffic_schemas.POLLING_NOT_RELEVANT
COOLDOWN = traffic_schemas.COOLDOWN_NOT_RELEVANT
KEDA_WARNING_CASES = [
    (1, None, 30, None, False, [POLLING]),  # "... PollingInterval ... minReplicaCount > 0 and idleReplicaCount not set"
    (2, 1, 30, None, False, [POLLING]),  # "... PollingInterval ... minReplicaCount > 0 and idleReplicaCount > 0"
    (2, 0, 30, None, False, []),  # "should NOT emit warning when PollingInterval is set with idleReplicaCount = 0"
    (2, 1, 30, None, True, []),  # "... PollingInterval is set with useCachedMetrics enabled"
    (2, 1, None, None, False, []),  # "should NOT emit warning when PollingInterval is not set"
    (1, None, None, 300, False, [COOLDOWN]),  # "... CooldownPeriod ... idleReplicaCount not set"
    (2, 1, None, 300, False, [COOLDOWN]),  # "... CooldownPeriod ... idleReplicaCount > 0"
    (2, 0, None, 300, False, []),  # "should NOT emit warning when CooldownPeriod is set with idleReplicaCount = 0"
    (2, 1, None, None, False, []),  # "should NOT emit warning when CooldownPeriod is not set"
    (2, 1, 30, 300, False, [POLLING, COOLDOWN]),  # "should emit both warnings when both ... are misconfigured"
    (2, 0, 30, 300, False, []),  # "should emit no warnings when both are properly configured with idleReplicaCount = 0"
]


@pytest.mark.parametrize(("low", "idle", "polling", "cooldown", "cached", "expected"), KEDA_WARNING_CASES)
def test_the_warning_check_is_kedas(
    low: int, idle: int | None, polling: int | None, cooldown: int | None, cached: bool, expected: list[str]
) -> None:
    spec: dict[str, Any] = {"minReplicaCount": low, "triggers": [{"type": "prometheus", "useCachedMetrics": cached}]}
    for key, value in (("idleReplicaCount", idle), ("pollingInterval", polling), ("cooldownPeriod", cooldown)):
        if value is not None:
            spec[key] = value
    assert traffic_schemas.keda_warnings({"spec": spec}) == expected


@pytest.mark.parametrize("min_replicas", [0, 1, 2])
def test_polling_and_cooldown_are_rendered_only_where_keda_uses_them(min_replicas: int) -> None:
    manifest = example(QWEN)
    manifest["spec"]["autoscaling"].update(minReplicas=min_replicas, pollingIntervalSeconds=20)
    scaled = of_kind(render(manifest), "ScaledObject")
    traffic_schemas.validate_scaled_object(scaled)  # no warning from KEDA's webhook
    assert traffic_schemas.keda_warnings(scaled) == []
    spec = scaled["spec"]
    if min_replicas == 0:  # 0 <-> 1 is KEDA's own loop: it polls, and waits the scale-down window
        down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (20, down["stabilizationWindowSeconds"])
    else:
        assert "pollingInterval" not in spec and "cooldownPeriod" not in spec


# -- an authenticated or https Prometheus ---------------------------------------------------------------------


def test_an_authenticated_prometheus_is_queried_through_the_trigger_authentication() -> None:
    manifest = example(QWEN)
    manifest["spec"]["autoscaling"]["prometheus"] = {
        "address": "https://prometheus.example.com",
        "authenticationRef": {"name": "prometheus-reader"},
        "authModes": ["bearer", "tls"],
    }
    assert crd.validate(manifest) == []
    scaled = of_kind(render(manifest), "ScaledObject")
    traffic_schemas.validate_scaled_object(scaled)
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["authenticationRef"] == {"name": "prometheus-reader", "kind": "TriggerAuthentication"}
        assert trigger["metadata"]["serverAddress"] == "https://prometheus.example.com"
        assert trigger["metadata"]["authModes"] == "bearer,tls"
        assert "unsafeSsl" not in trigger["metadata"]


def test_a_cluster_trigger_authentication_and_unsafe_ssl() -> None:
    manifest = example(QWEN)
    manifest["spec"]["autoscaling"]["minReplicas"] = 0  # the picker's trigger too
    manifest["spec"]["autoscaling"]["prometheus"] = {
        "authenticationRef": {"name": "monitoring", "kind": "ClusterTriggerAuthentication"},
        "unsafeSsl": True,
    }
    scaled = of_kind(render(manifest), "ScaledObject")
    traffic_schemas.validate_scaled_object(scaled)
    assert len(scaled["spec"]["triggers"]) == 3
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["authenticationRef"] == {"name": "monitoring", "kind": "ClusterTriggerAuthentication"}
        assert trigger["metadata"]["unsafeSsl"] == "true" and "authModes" not in trigger["metadata"]
        assert trigger["metadata"]["serverAddress"] == CONFIG.prometheus_address


def test_without_authentication_the_triggers_are_as_before() -> None:
    scaled = of_kind(render(example(QWEN)), "ScaledObject")
    for trigger in scaled["spec"]["triggers"]:
        assert "authenticationRef" not in trigger
        assert set(trigger["metadata"]) == {
            "serverAddress",
            "query",
            "threshold",
            "activationThreshold",
            "ignoreNullValues",
        }


# kedacore/keda v2.20.2, pkg/scalers/prometheus_scaler_test.go testPrometheusAuthMetadata: the authModes
# values of its accepted cases ("tls, basic" spaced as written), and pkg/scalers/scalersconfig/
# typed_config_test.go TestExclusive's rule (two of an exclusive set refused), with our modes.
KEDA_AUTH_MODES = [("tls", True), ("bearer", True), ("basic", True), ("tls, basic", True), ("custom", True)]
KEDA_AUTH_MODES += [("basic,bearer", False), ("bearer,oauth", False), ("digest", False)]


@pytest.mark.parametrize(("modes", "accepted"), KEDA_AUTH_MODES)
def test_auth_modes_are_read_as_kedas_scaler_reads_them(modes: str, accepted: bool) -> None:
    try:
        traffic_schemas.assert_auth_modes(modes)
    except AssertionError:
        assert not accepted
    else:
        assert accepted


@pytest.mark.parametrize(
    ("prometheus", "fragment"),
    [
        ({"authModes": ["basic"]}, "authModes needs authenticationRef"),
        ({"authenticationRef": {"name": "a"}, "authModes": ["basic", "bearer"]}, "only one of basic, bearer and oauth"),
        ({"authenticationRef": {"name": "a"}, "authModes": ["digest"]}, "authModes[0]"),
        ({"authenticationRef": {"name": "a"}, "authModes": ["tls", "tls"]}, "duplicate"),
        ({"authenticationRef": {"name": "a", "kind": "Secret"}}, "'Secret' is not one of"),
        ({"authenticationRef": {}}, "'name' is a required property"),
        (
            {
                "address": "https://elsewhere.example.com",
                "authenticationRef": {"name": "a", "kind": "ClusterTriggerAuthentication"},
            },
            "credentials go only to the operator's Prometheus",
        ),
    ],
)
def test_the_crd_refuses_what_keda_would(prometheus: dict[str, Any], fragment: str) -> None:
    manifest = example(QWEN)
    manifest["spec"]["autoscaling"]["prometheus"] = prometheus
    errors = crd.validate(manifest)
    assert any(fragment in error for error in errors), errors


# -- without the APIs ----------------------------------------------------------------------------------------


def test_without_keda_or_the_inference_extension_the_status_says_so_and_nothing_else_changes() -> None:
    manifest = example(QWEN)
    manifest["metadata"]["uid"] = UID
    without = desired_state(manifest, CONFIG, frozenset({"PodMonitor"}))
    plain = copy.deepcopy(manifest)
    del plain["spec"]["autoscaling"], plain["spec"]["routing"]
    assert without.manifests == desired_state(plain, CONFIG, frozenset({"PodMonitor"})).manifests
    assert without.notes == (
        "ScaledObject not managed: the keda.sh/v1alpha1 API is not installed",
        "InferencePool not managed: the inference.networking.k8s.io/v1 API is not installed",
    )
    served = desired_state(manifest, CONFIG, frozenset({"PodMonitor", "ScaledObject", "InferencePool"}))
    assert {"ScaledObject", "InferencePool", "Deployment-epp", "Role-epp"} <= served.manifests.keys()


# -- targets -------------------------------------------------------------------------------------------------


def test_an_explicit_target_above_the_captured_batch_is_refused_with_the_field() -> None:
    manifest = autoscaled(QWEN, runningRequestsPerReplica=49)
    del manifest["spec"]["routing"]
    _, problems = read_spec(manifest, CONFIG)
    assert [p.field for p in problems] == ["spec.autoscaling.runningRequestsPerReplica"]
    assert "48" in problems[0].message
    manifest["spec"]["autoscaling"]["runningRequestsPerReplica"] = 48
    assert read_spec(manifest, CONFIG)[1] == []


def test_explicit_capture_sizes_lower_the_target() -> None:
    manifest = autoscaled(QWEN)
    manifest["spec"]["graph"]["captureSizes"] = [1, 2, 4, 8, 16]
    spec = parse_spec(manifest["spec"])
    assert spec.autoscaling is not None
    target = scaling.targets(spec.autoscaling, scaling.capacity(spec, api_spec.plan_options(spec)))
    assert (target.capacity.largest_batch, target.running) == (16, 12)
    assert "largest captured decode batch (16 requests per DP rank)" in target.reason


def test_flashcomm1_in_the_additional_config_lowers_the_target_as_the_engine_drops_sizes() -> None:
    # FULL_DECODE_ONLY under flashcomm1 keeps only multiples of TP (update_sizes_for_sequence_parallelism)
    # and nothing above max_num_seqs (initialize_cudagraph_keys): with max_num_seqs 30 and TP 4 the
    # plan adds 28, the largest multiple of 4 the engine keeps; batches of 29 and 30 run eagerly.
    manifest = autoscaled(QWEN)
    manifest["spec"]["engine"]["maxNumSeqs"] = 30
    manifest["spec"]["parallelism"] = {"tensor": 4}
    manifest["spec"]["npu"]["count"] = 4
    manifest["spec"]["engine"]["additionalConfig"] = {"enable_flashcomm1": True}
    spec = parse_spec(manifest["spec"])
    options = api_spec.plan_options(spec)
    assert options.flashcomm1 is True
    assert scaling.capacity(spec, options).largest_batch == 28


def test_the_status_shows_the_target_and_why() -> None:
    spec = parse_spec(example(QWEN)["spec"])
    status = compute_status("qwen25-7b", "llm", 1, spec, Observed(startup_seconds=420), {}, "2026-01-01T00:00:00Z")
    assert status["autoscaling"] == {
        "runningRequestsPerReplica": 38,
        "queueDepthPerReplica": 38,
        "largestCapturedBatch": 48,
        "dataParallelRanks": 1,
        "startupSeconds": 420,
        "reason": "80% of the plan's largest captured decode batch (48 requests per DP rank) x 1 DP rank = 48; "
        "scaling pace from the startup seen (420 s)",
    }
    assert status["routing"] == {"inferencePool": "qwen25-7b", "maxConcurrencyPerEndpoint": 48}


def scaled_object_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The ScaledObject the reconcile would apply (it reads the startup seen from the status)."""
    manifest["metadata"].setdefault("uid", UID)
    served = frozenset({"PodMonitor", "ScaledObject", "InferencePool", "HTTPRoute"})
    return desired_state(manifest, CONFIG, served).manifests["ScaledObject"]


def test_the_pace_follows_the_startup_seen() -> None:
    manifest = example(QWEN)
    manifest["status"] = {"autoscaling": {"startupSeconds": 420}}
    behavior = scaled_object_of(manifest)["spec"]["advanced"]["horizontalPodAutoscalerConfig"]
    up, down = behavior["behavior"]["scaleUp"], behavior["behavior"]["scaleDown"]
    assert {p["periodSeconds"] for p in up["policies"]} == {420}
    assert down["stabilizationWindowSeconds"] == 840
    # Before any replica was seen starting, the startup timeout stands in, within HPA's bounds.
    del manifest["status"]
    behavior = scaled_object_of(manifest)["spec"]["advanced"]["horizontalPodAutoscalerConfig"]
    assert {p["periodSeconds"] for p in behavior["behavior"]["scaleUp"]["policies"]} == {
        min(parse_spec(manifest["spec"]).engine.startup_timeout_seconds, 1800)
    }


def test_the_startup_seen_is_the_longest_ready_pod_in_whole_minutes() -> None:
    def pod(start: str, ready: str | None) -> dict[str, Any]:
        conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready}] if ready else []
        return {"status": {"startTime": start, "conditions": conditions}}

    pods = [pod("2026-01-01T00:00:00Z", "2026-01-01T00:06:01Z"), pod("2026-01-01T00:00:00Z", "2026-01-01T00:02:00Z")]
    assert scaling.observed_startup_seconds(pods) == 420
    assert scaling.observed_startup_seconds([pod("2026-01-01T00:00:00Z", None)]) is None
    assert scaling.observed_startup_seconds([]) is None


# -- properties ----------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    max_num_seqs=st.integers(1, 512),
    speculative=st.integers(0, 3),
    data=st.sampled_from((1, 2, 4, 8)),
    utilization=st.integers(1, 100),
    explicit=st.one_of(st.none(), st.integers(1, 4096)),
    max_capture=st.one_of(st.none(), st.integers(1, 4096)),
)
def test_the_target_never_exceeds_the_largest_captured_batch_times_dp_ranks(
    max_num_seqs: int, speculative: int, data: int, utilization: int, explicit: int | None, max_capture: int | None
) -> None:
    q = 1 + speculative
    options = PlanOptions(
        max_num_seqs=max_num_seqs,
        speculative_method="mtp" if speculative else None,
        speculative_tokens=speculative,
        data_parallel=data,
        max_capture_size=max_capture * q if max_capture else None,
    )
    largest = largest_decode_batch(options)
    autoscaling = AutoscalingSpec(1, 4, utilization, explicit, None, None, None, 15)
    cap = scaling.Capacity(largest, data, max_num_seqs)
    target = scaling.targets(autoscaling, cap)
    assert 1 <= target.running <= largest * data
    assert largest <= max_num_seqs and (max_capture is None or largest <= max_capture)


@settings(**PROPERTY_SETTINGS)
@given(cases())
def test_the_operators_largest_batch_is_the_one_every_plan_captures(
    case: tuple[PlanOptions, DeviceInfo, ModelInfo, dict[str, str]],
) -> None:
    """The operator's source of truth agrees with the runtime's real plan, on any device and model,
    whenever the plan keeps the requested mode (a downgrade is the pods' to report)."""
    options = case[0]
    plan = try_plan(*case)
    assume(plan is not None and plan.effective_mode == options.graph_mode and plan.capture_sizes)
    assert plan is not None
    q = 1 + options.speculative_tokens
    assert largest_decode_batch(options) == min(plan.capture_sizes[-1] // q, options.max_num_seqs)


@given(min_replicas=st.integers(0, 3), routing=st.booleans())
@settings(max_examples=20, deadline=None)
def test_scale_to_zero_is_refused_without_routing(min_replicas: int, routing: bool) -> None:
    manifest = autoscaled(QWEN, minReplicas=min_replicas)
    if not routing:
        del manifest["spec"]["routing"]
    refused = min_replicas == 0 and not routing
    cel = [e for e in crd.validate(manifest) if "scale to zero" in e]
    assert bool(cel) == refused
    fields = [p.field for p in read_spec(manifest, CONFIG)[1]]
    assert ("spec.autoscaling.minReplicas" in fields) == refused


def test_the_child_table_knows_every_kind_the_builders_make() -> None:
    objects = render(example(DEEPSEEK))
    keys = [children.kind_of(o, "deepseek-r1").key for o in objects]
    order = [kind.key for kind in children.KINDS]
    assert keys == sorted(keys, key=order.index), "built in apply order"


def test_autoscaling_without_the_pod_monitor_is_refused_naming_the_field() -> None:
    # The queries select by inference_npu_dev_name, which only our PodMonitor gives the series: without
    # it KEDA reads nothing (0) and never scales up, silently.
    manifest = example(QWEN)
    manifest["spec"]["metrics"] = {"podMonitor": {"enabled": False}}
    spec, problems = read_spec(manifest, CONFIG)
    assert spec is not None
    assert [p.field for p in problems] == ["spec.metrics.podMonitor.enabled"]
    assert "never scales up" in problems[0].message
    for name in (QWEN, DEEPSEEK):  # the shipped examples that autoscale ask for their PodMonitor
        assert read_spec(example(name), CONFIG)[1] == []


def test_without_the_pod_monitor_api_the_status_says_autoscaling_sees_no_load() -> None:
    manifest = example(QWEN)
    manifest["metadata"]["uid"] = UID
    served = frozenset({"ScaledObject", "InferencePool", "HTTPRoute"})  # no PodMonitor CRD
    desired = desired_state(manifest, CONFIG, served)
    assert any("PodMonitor not managed" in note and "sees no load" in note for note in desired.notes)


def ready_pod(started: str, ready: str) -> dict[str, Any]:
    return {
        "status": {
            "startTime": started,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready}],
        }
    }


def test_the_startup_in_force_follows_the_ready_pods_and_is_kept_while_none_is() -> None:
    after_cold_start = {"autoscaling": {"startupSeconds": 1800}}  # a first pod downloaded the weights
    warm = ready_pod("2026-01-01T00:00:00Z", "2026-01-01T00:01:30Z")  # its successor, from the cache
    assert scaling.startup_in_force([warm], after_cold_start) == 120  # in whole minutes, not stuck at 1800
    assert scaling.startup_in_force([], after_cold_start) == 1800  # scaled to zero: the status keeps it
    assert scaling.startup_in_force([], {}) is None


def test_a_missing_api_is_noted_once_whatever_the_children_that_need_it() -> None:
    manifest = example(QWEN)  # its own PodMonitor and the endpoint picker's
    manifest["metadata"]["uid"] = UID
    notes = desired_state(manifest, CONFIG, frozenset({"ScaledObject", "InferencePool", "HTTPRoute"})).notes
    assert sum(note.startswith("PodMonitor not managed:") for note in notes) == 1
