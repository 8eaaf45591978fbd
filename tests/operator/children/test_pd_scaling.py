"""A P/D resource with spec.autoscaling and spec.routing: a ScaledObject per role, each on its own scale
target and signal, checked against KEDA v2.20.2's CRD (tests/operator/traffic_schemas.py), the prefill
role handed to LeaderWorkerSet's DisaggregatedSetRoleScaler (tests/operator/ds_schema.py), and an
InferencePool of the routers."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import assume, given, settings
from npu_operator.api import crd
from npu_operator.api.spec import parse_spec, plan_options
from npu_operator.api.validation import validate_spec
from npu_operator.children import kinds, routing, scaling
from npu_operator.controller.desired import adopted_children, read_spec
from npu_operator.kube import names
from npu_operator.status.resource import Observed, compute_status
from npu_runtime.contract import PlanOptions
from npu_runtime.planner.capture_candidates import batched_token_budget
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.probe import DeviceInfo
from npu_runtime.routing.options import DEFAULT_MAX_IN_FLIGHT

from tests.examples import TEST_CONFIG, example
from tests.operator import ds_schema, traffic_schemas
from tests.runtime.planner.test_plan_properties import PROPERTY_SETTINGS, cases, try_plan

CONFIG = TEST_CONFIG
UID = "11111111-2222-3333-4444-555555555555"
PD = "deepseek-r1-w8a8-pd.yaml"
CPU_PD = "sandbox-cpu-pd.yaml"


def autoscaled(name: str = PD, routing_spec: dict[str, Any] | None = None, **prefill: Any) -> dict[str, Any]:
    manifest = example(name)
    manifest["metadata"]["uid"] = UID
    manifest["spec"]["autoscaling"] = {"maxReplicas": 4}
    manifest["spec"].setdefault("metrics", {})["podMonitor"] = {"enabled": True}
    manifest["spec"]["disaggregation"]["prefill"].update(prefill)
    if routing_spec is not None:
        manifest["spec"]["routing"] = routing_spec
    return manifest


def render(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    assert not crd.validate(manifest), crd.validate(manifest)
    spec, problems = read_spec(manifest, CONFIG)
    assert spec is not None and not problems, problems
    return adopted_children(manifest, spec, CONFIG, kinds.Capabilities.everything())


def of_kind(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, [(o["kind"], o["metadata"]["name"]) for o in objects]
    return found[0]


def test_each_role_has_a_scaled_object_on_its_own_scale_target_and_signal() -> None:
    manifest = autoscaled(maxReplicas=6)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    objects = render(manifest)
    decode = of_kind(objects, "ScaledObject", name)
    prefill = of_kind(objects, "ScaledObject", f"{name}-prefill")
    for scaled in (decode, prefill):
        traffic_schemas.validate_scaled_object(scaled)

    # decode: the resource's own scale subresource (its replicas are the decode role's), on the decode
    # engines only, against the captured decode batch x DP ranks as a single-node resource is.
    assert decode["spec"]["scaleTargetRef"] == {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": name}
    spec = parse_spec(manifest["spec"])
    cap = scaling.capacity(spec, plan_options(spec))
    assert cap.data_parallel == 32  # the example's decode role: dp 32 x tp 1 over two A3 nodes
    running = scaling.targets(spec.autoscaling, cap).running  # type: ignore[arg-type]
    triggers = {t["name"]: t["metadata"] for t in decode["spec"]["triggers"]}
    assert triggers["running-requests"]["threshold"] == str(running)
    for trigger in triggers.values():
        assert 'inference_npu_dev_role="decode"' in trigger["query"], trigger["query"]
    assert (decode["spec"]["minReplicaCount"], decode["spec"]["maxReplicaCount"]) == (1, 4)

    # prefill: the DisaggregatedSetRoleScaler LeaderWorkerSet creates for the External role, on the
    # prompt tokens the router has at the prefill engines, against 80% of a step's token budget.
    assert prefill["spec"]["scaleTargetRef"] == {
        "apiVersion": ds_schema.ROLE_SCALER_API_VERSION,
        "kind": ds_schema.ROLE_SCALER_KIND,
        "name": ds_schema.scaler_name(name, "prefill"),
    }
    (trigger,) = prefill["spec"]["triggers"]
    assert trigger["metadata"]["query"] == (
        "sum(avg_over_time(npu_router_engine_work"
        f'{{namespace="{namespace}",inference_npu_dev_name="{name}",role="prefill"}}[1m]))'
    )
    prefill_options = PlanOptions(
        graph_mode="NONE", max_num_seqs=16, max_num_batched_tokens=16384, tensor_parallel=8, data_parallel=2
    )
    # The example's prefill role: maxNumBatchedTokens 16384 per DP rank, dp 2.
    assert batched_token_budget(prefill_options) == 16384
    assert trigger["metadata"]["threshold"] == str(16384 * 2 * 80 // 100)
    assert (prefill["spec"]["minReplicaCount"], prefill["spec"]["maxReplicaCount"]) == (1, 6)
    # The same pace as decode: a startup per step up, twice a startup before one down.
    assert prefill["spec"]["advanced"] == decode["spec"]["advanced"]


def test_the_prefill_role_is_external_only_with_autoscaling_and_the_set_stays_valid() -> None:
    for manifest, external in ((example(PD), False), (autoscaled(), True)):
        manifest["metadata"]["uid"] = UID
        objects = render(manifest)
        ds = next(o for o in objects if o["kind"] == "DisaggregatedSet")
        ds_schema.validate(ds)
        scaling_of = {role["name"]: role.get("scaling") for role in ds["spec"]["roles"]}
        assert scaling_of == {"prefill": {"mode": "External"} if external else None, "decode": None}
        names_ = {o["metadata"]["name"] for o in objects if o["kind"] == "ScaledObject"}
        assert names_ == ({"deepseek-r1-pd", "deepseek-r1-pd-prefill"} if external else set())


def test_the_prefill_bounds_default_to_autoscalings_and_are_checked() -> None:
    objects = render(autoscaled(minReplicas=2))
    prefill = of_kind(objects, "ScaledObject", "deepseek-r1-pd-prefill")
    assert (prefill["spec"]["minReplicaCount"], prefill["spec"]["maxReplicaCount"]) == (2, 4)
    # Above autoscaling.maxReplicas with no prefill.maxReplicas: the CRD cannot see it, the operator can.
    manifest = autoscaled(minReplicas=5)
    assert not crd.validate(manifest)
    _, problems = read_spec(manifest, CONFIG)
    assert [p.field for p in problems] == ["spec.disaggregation.prefill.minReplicas"]


def test_scale_to_zero_is_refused_with_p_d() -> None:
    manifest = autoscaled(routing_spec={})
    manifest["spec"]["autoscaling"]["minReplicas"] = 0
    assert any("not offered with spec.disaggregation" in error for error in crd.validate(manifest))
    _, problems = read_spec(manifest, CONFIG)
    assert "spec.autoscaling.minReplicas" in [p.field for p in problems]


def test_the_pod_monitor_labels_each_series_with_its_role_on_p_d_only() -> None:
    pd = of_kind(render(autoscaled()), "PodMonitor", "deepseek-r1-pd")
    assert pd["spec"]["podTargetLabels"] == [names.NAME_LABEL, names.ROLE_LABEL]
    single = example("qwen2.5-7b-910b.yaml")
    single["metadata"]["uid"] = UID
    monitor = of_kind(render(single), "PodMonitor", single["metadata"]["name"])
    assert monitor["spec"]["podTargetLabels"] == [names.NAME_LABEL]


def test_an_inference_pool_in_front_of_p_d_selects_the_routers() -> None:
    manifest = autoscaled(routing_spec={"gateway": {"name": "inference-gateway", "hostnames": ["llm.example.com"]}})
    name = manifest["metadata"]["name"]
    objects = render(manifest)
    pool = of_kind(objects, "InferencePool", name)
    traffic_schemas.validate_inference_pool(pool)
    router = of_kind(objects, "Deployment", name)
    assert pool["spec"]["selector"]["matchLabels"] == router["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["selector"]["matchLabels"][names.ROLE_LABEL] == names.ROUTER
    assert pool["spec"]["targetPorts"] == [{"number": names.HTTP_PORT}]
    config = yaml.safe_load(of_kind(objects, "ConfigMap", f"{name}-epp")["data"][routing.PICKER_CONFIG_FILE])
    traffic_schemas.validate_picker_config(config)
    types = {plugin["type"] for plugin in config["plugins"]}
    # No vLLM metrics are read from a router; the in-flight counts pick the least busy router, never
    # one above its own --max-in-flight.
    assert types == {"inflight-load-producer", "concurrency-detector", "active-request-scorer"}
    detector = next(p for p in config["plugins"] if p["type"] == "concurrency-detector")
    assert detector["parameters"]["maxConcurrency"] == DEFAULT_MAX_IN_FLIGHT
    route = of_kind(objects, "HTTPRoute", name)
    traffic_schemas.validate_http_route(route)
    spec = parse_spec(manifest["spec"])
    status = compute_status(name, "llm", 1, spec, Observed(), {}, "2026-01-01T00:00:00Z")
    assert status["routing"] == {"inferencePool": name, "maxConcurrencyPerEndpoint": DEFAULT_MAX_IN_FLIGHT}


def test_the_cpu_example_scales_per_role_too() -> None:
    manifest = autoscaled(CPU_PD, routing_spec={})
    objects = render(manifest)
    for scaled in (o for o in objects if o["kind"] == "ScaledObject"):
        traffic_schemas.validate_scaled_object(scaled)
    assert validate_spec(parse_spec(copy.deepcopy(manifest["spec"]))) == []


def test_a_resource_without_p_d_reads_every_engine_of_it_as_before() -> None:
    assert (
        scaling.running_query("m", "ns") == 'sum(vllm:num_requests_running{namespace="ns",inference_npu_dev_name="m"})'
    )


def test_the_status_shows_each_roles_target_and_why() -> None:
    manifest = autoscaled(maxReplicas=6)
    spec = parse_spec(manifest["spec"])
    status = compute_status("deepseek-r1-pd", "llm", 1, spec, Observed(), {}, "2026-01-01T00:00:00Z")
    prefill = status["autoscaling"]["prefill"]
    assert prefill == {
        "queuedTokensPerReplica": 26214,
        "batchedTokens": 16384,
        "dataParallelRanks": 2,
        "minReplicas": 1,
        "maxReplicas": 6,
        "reason": "80% of the prefill plan's max_num_batched_tokens (16384 per DP rank) x 2 DP ranks "
        "= 32768 prompt tokens per step",
    }
    assert status["autoscaling"]["dataParallelRanks"] == 32  # the decode role's, as before
    assert not crd.validate({**manifest, "status": status}), "the status fits the CRD's status schema"


@settings(**PROPERTY_SETTINGS)
@given(cases())
def test_the_prefill_budget_is_the_one_every_plan_pins(
    case: tuple[PlanOptions, DeviceInfo, ModelInfo, dict[str, str]],
) -> None:
    """The prefill target's budget, from the options alone, is the max_num_batched_tokens the runtime's
    real plan gives the engine, on any device and model, whenever the plan keeps the requested mode."""
    options = case[0]
    plan = try_plan(*case)
    assume(plan is not None and plan.effective_mode == options.graph_mode)
    assert plan is not None
    assert batched_token_budget(options) == plan.max_num_batched_tokens
