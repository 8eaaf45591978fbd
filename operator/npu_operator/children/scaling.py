"""spec.autoscaling: per-replica targets taken from the capture plan, and the KEDA ScaledObject that keeps them.

The one number everything here follows is the largest decode batch a replica runs in a captured
graph. Above it vLLM decodes eagerly, several times slower (vllm-ascend #16049 measured about 7.5x
for an off-grid max_num_seqs), so an autoscaler whose per-replica target lets batches outgrow it
throws away the graph mode the operator planned.

Source of truth: the plan the runtime makes from the spec (`npu_runtime.planner.capture_candidates.
largest_decode_batch`), never the pods' reports. The planner always keeps its ceiling when it
thins capture sizes, so the largest captured batch depends on the spec alone: it is known before
any pod runs, is the same for every pod, and keeps the builders pure (a manifest that moved with
pod reports would change under a rollout). When the engines run something else (a downgrade to
NONE, a failed capture) status.graph and its Degraded condition say so; the target is not raised
to follow a broken engine.

The ScaledObject (KEDA, kedacore/keda v2.20.2, config/crd/bases/keda.sh_scaledobjects.yaml) targets
the NPUInference itself through its scale subresource (`scaleTargetRef` apiVersion/kind/name): KEDA's
HPA writes spec.replicas and reads status.replicas and status.selector, which count replicas
(LeaderWorkerSet groups for multi-node, whose selector picks the leaders, as LWS's own
status.hpaPodSelector does). Its triggers are KEDA's Prometheus scaler (pkg/scalers/
prometheus_scaler.go): every metadata value is a string; the query must return one element (more
is an error, none is 0 with ignoreNullValues); with metricType AverageValue the HPA asks for
ceil(value / threshold) replicas, so each query sums one resource's series and the threshold is
the per-replica target.

With spec.disaggregation each role scales on its own signal, through its own scale target:
- decode, as above, through the NPUInference's scale subresource (its replicas are the decode
  role's), on the decode engines' running and waiting requests only (`inference_npu_dev_role`,
  which the PodMonitor of a P/D resource adds);
- prefill, through the DisaggregatedSetRoleScaler `<name>-prefill` that LeaderWorkerSet v0.10's
  DisaggregatedSet controller creates for a role with `scaling.mode: External`
  (`names.DS_ROLE_SCALERS`), on the prompt tokens waiting for or being prefilled on the prefill
  engines, as the router counts them (npu_router_engine_work{role="prefill"}: a prompt's tokens
  from when it is sent to a prefill engine until its answer), against what a prefill replica takes
  into one step: the plan's max_num_batched_tokens per DP rank x its DP ranks
  (`npu_runtime.planner.capture_candidates.batched_token_budget`). Above it a prompt waits at least a step more
  before its first token.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.metrics import ROUTER_ENGINE_WORK
from npu_runtime.planner.capture_candidates import batched_token_budget, largest_decode_batch

from npu_operator.api import crd
from npu_operator.api.roles import role_spec
from npu_operator.api.spec import AutoscalingSpec, NPUInferenceSpec, PrometheusSpec, SpecError, plan_options
from npu_operator.children.kinds import PREFILL_SCALED_OBJECT
from npu_operator.kube.names import DS_ROLE_SCALERS, role_scaler_name

JSON = dict[str, Any]

KEDA_API_VERSION: Final = "keda.sh/v1alpha1"
SCALED_OBJECT_KIND: Final = "ScaledObject"
# The label the PodMonitors give every series of a resource's pods (prometheus-operator's sanitized
# form of the pod label inference.npu.dev/name, through podTargetLabels; see workloads.build_pod_monitor).
RESOURCE_LABEL: Final = "inference_npu_dev_name"
# With spec.disaggregation, the pod label inference.npu.dev/role the same way (prefill, decode, router).
ROLE_TARGET_LABEL: Final = "inference_npu_dev_role"
# The router's per-engine outstanding work; for prefill, the prompt tokens sent and not yet answered.
ROUTER_WORK_METRIC: Final = ROUTER_ENGINE_WORK.name
PREFILL_WINDOW: Final = "1m"  # a few scrapes (the PodMonitor's interval, 30 s by default)
# vLLM's own gauges, per engine (DP rank), on the API server's /metrics (port http).
RUNNING_METRIC: Final = "vllm:num_requests_running"
WAITING_METRIC: Final = "vllm:num_requests_waiting"
# llm-d's endpoint picker: requests its flow control holds (llm-d/llm-d-router v0.9.0,
# pkg/epp/metrics/llm_d_router_metrics.go llmdFlowControlQueueSize: labels fairness_id, priority,
# inference_pool (= --pool-name), model_name, target_model_name), scraped by the picker's own
# PodMonitor, which adds `namespace` (routing.build_picker_pod_monitor).
PICKER_QUEUE_METRIC: Final = "llm_d_epp_flow_control_queue_size"

# HPA's own bounds (k8s.io/api autoscaling/v2 HPAScalingRules): periodSeconds 1..1800,
# stabilizationWindowSeconds 0..3600.
MAX_POLICY_PERIOD: Final = 1800
MAX_STABILIZATION: Final = 3600
MIN_SCALE_DOWN_WINDOW: Final = 300  # HPA's own default for scale-down
STARTUP_ROUNDING: Final = 60  # observed startups are kept in whole minutes: one jittery pod does not re-render


@dataclasses.dataclass(frozen=True)
class Capacity:
    """What one replica decodes in captured graphs, from the plan."""

    largest_batch: int  # requests per DP rank in the largest captured decode graph (0: graph mode NONE)
    data_parallel: int  # DP ranks in one replica; each schedules and decodes its own batch
    max_num_seqs: int  # the engine's own cap per DP rank

    @property
    def per_replica(self) -> int:
        """Requests one replica decodes at once in a graph; without graphs, the engine's own cap."""
        return (self.largest_batch or self.max_num_seqs) * self.data_parallel


@dataclasses.dataclass(frozen=True)
class Targets:
    """The per-replica targets KEDA compares with, and why they are what they are."""

    running: int
    queue: int
    capacity: Capacity
    reason: str


def capacity(spec: NPUInferenceSpec, options: PlanOptions) -> Capacity:
    """The replica's graph capacity; `options` are the spec's plan options (`api.spec.plan_options`).
    Raises PlanError where the runtime's planner would refuse them."""
    return Capacity(
        largest_batch=largest_decode_batch(options),
        data_parallel=spec.parallelism.data,
        max_num_seqs=spec.engine.max_num_seqs,
    )


@dataclasses.dataclass(frozen=True)
class PrefillCapacity:
    """What one prefill replica takes into one step, from the prefill role's plan."""

    batched_tokens: int  # max_num_batched_tokens per DP rank
    data_parallel: int

    @property
    def per_replica(self) -> int:
        return self.batched_tokens * self.data_parallel


@dataclasses.dataclass(frozen=True)
class PrefillTarget:
    queued_tokens: int  # per prefill replica
    min_replicas: int
    max_replicas: int
    capacity: PrefillCapacity
    reason: str


def prefill_capacity(spec: NPUInferenceSpec) -> PrefillCapacity:
    """The prefill role's step budget. Raises PlanError where the planner would refuse its options."""
    prefill = role_spec(spec, "prefill")
    return PrefillCapacity(batched_token_budget(plan_options(prefill)), prefill.parallelism.data)


def prefill_target(spec: NPUInferenceSpec, cap: PrefillCapacity) -> PrefillTarget:
    """The prefill role's queued-token target per replica (autoscaling.targetUtilization of its step
    budget) and its bounds (disaggregation.prefill.minReplicas, maxReplicas or autoscaling.maxReplicas)."""
    assert spec.autoscaling is not None and spec.disaggregation is not None
    prefill, utilization = spec.disaggregation.prefill, spec.autoscaling.target_utilization
    tokens = max(1, cap.per_replica * utilization // 100)
    ranks = f"{cap.data_parallel} DP rank{'s' if cap.data_parallel != 1 else ''}"
    reason = (
        f"{utilization}% of the prefill plan's max_num_batched_tokens ({cap.batched_tokens} per DP rank) x {ranks} "
        f"= {cap.per_replica} prompt tokens per step"
    )
    return PrefillTarget(
        queued_tokens=tokens,
        min_replicas=prefill.min_replicas,
        max_replicas=prefill.max_replicas or spec.autoscaling.max_replicas,
        capacity=cap,
        reason=reason,
    )


def targets(autoscaling: AutoscalingSpec, cap: Capacity) -> Targets:
    """The running and queue targets per replica; never above the plan's capacity (see `spec_problems`)."""
    where = (
        f"the plan's largest captured decode batch ({cap.largest_batch} requests per DP rank)"
        if cap.largest_batch
        else f"engine.maxNumSeqs ({cap.max_num_seqs} per DP rank; graph mode NONE captures nothing)"
    )
    capacity_words = f"{where} x {cap.data_parallel} DP rank{'s' if cap.data_parallel != 1 else ''}"
    if autoscaling.running_requests_per_replica is not None:
        running = min(autoscaling.running_requests_per_replica, cap.per_replica)
        reason = f"runningRequestsPerReplica {running} as set, within {capacity_words} = {cap.per_replica}"
    else:
        running = max(1, cap.per_replica * autoscaling.target_utilization // 100)
        reason = f"{autoscaling.target_utilization}% of {capacity_words} = {cap.per_replica}"
    queue = autoscaling.queue_depth_per_replica or running
    return Targets(running=running, queue=queue, capacity=cap, reason=reason)


def spec_problems(spec: NPUInferenceSpec, options: PlanOptions) -> list[SpecError]:
    """What autoscaling and routing cannot serve although the schema lets it through, each naming its field."""
    if spec.autoscaling is None and spec.routing is None:
        return []
    try:
        cap = capacity(spec, options)
    except PlanError as exc:
        return [SpecError(f"spec (plan option {exc.field})", str(exc))]
    autoscaling = spec.autoscaling
    if autoscaling is None:
        return []
    problems: list[SpecError] = []
    explicit = autoscaling.running_requests_per_replica
    if explicit is not None and explicit > cap.per_replica:
        problems.append(
            SpecError(
                "spec.autoscaling.runningRequestsPerReplica",
                f"{explicit} is above what one replica decodes in a captured graph: the largest captured batch "
                f"({cap.largest_batch or cap.max_num_seqs}) x {cap.data_parallel} DP ranks = {cap.per_replica}; "
                "batches above it run eagerly, several times slower",
            )
        )
    if autoscaling.min_replicas == 0 and spec.routing is None:  # the CRD's CEL rule says the same
        problems.append(
            SpecError("spec.autoscaling.minReplicas", "0 (scale to zero) needs spec.routing to hold requests")
        )
    if spec.disaggregation is not None:
        problems += _prefill_problems(spec)
    return problems


def _prefill_problems(spec: NPUInferenceSpec) -> list[SpecError]:
    """A P/D resource's autoscaling: no scale to zero (the CRD says the same), the prefill bounds, its plan."""
    assert spec.autoscaling is not None and spec.disaggregation is not None
    problems: list[SpecError] = []
    if spec.autoscaling.min_replicas == 0:
        why = (
            "0 (scale to zero) is not offered with spec.disaggregation: the router holds no request while decode starts"
        )
        problems.append(SpecError("spec.autoscaling.minReplicas", why))
    try:
        target = prefill_target(spec, prefill_capacity(spec))
    except PlanError as exc:
        return [*problems, SpecError(f"spec.disaggregation.prefill (plan option {exc.field})", str(exc))]
    if target.min_replicas > target.max_replicas:
        why = (
            f"{target.min_replicas} is above the prefill role's most replicas ({target.max_replicas}, "
            "disaggregation.prefill.maxReplicas or else autoscaling.maxReplicas)"
        )
        problems.append(SpecError("spec.disaggregation.prefill.minReplicas", why))
    return problems


# -- startup -------------------------------------------------------------------------------------------


def observed_startup_seconds(pods: Iterable[Mapping[str, Any]]) -> int | None:
    """The longest startup (status.startTime to the Ready condition) among the ready pods, in whole
    minutes rounded up; None when no pod is ready. Weights plus graph capture dominate it."""
    longest: float | None = None
    for pod in pods:
        status = pod.get("status") or {}
        ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
        if not ready or ready.get("status") != "True":
            continue
        started, became_ready = _time(status.get("startTime")), _time(ready.get("lastTransitionTime"))
        if started is None or became_ready is None or became_ready < started:
            continue
        seconds = (became_ready - started).total_seconds()
        longest = seconds if longest is None else max(longest, seconds)
    if longest is None:
        return None
    return max(STARTUP_ROUNDING, math.ceil(longest / STARTUP_ROUNDING) * STARTUP_ROUNDING)


def seen_startup_seconds(status: Mapping[str, Any]) -> int | None:
    """The startup seen so far, as the resource's status keeps it (status.autoscaling.startupSeconds)."""
    seen = (status.get("autoscaling") or {}).get("startupSeconds")
    return seen if isinstance(seen, int) and not isinstance(seen, bool) and seen > 0 else None


def startup_in_force(pods: Iterable[Mapping[str, Any]], status: Mapping[str, Any]) -> int | None:
    """The startup the scaling pace follows: the ready pods' own (`observed_startup_seconds`) while
    there are any, so that one cold start with its download counts while that pod lives and not for
    ever; the one the status keeps while none is ready (scaled to zero, or before the first)."""
    return observed_startup_seconds(pods) or seen_startup_seconds(status)


def behavior(autoscaling: AutoscalingSpec, startup: int) -> JSON:
    """The HPA's scaling behaviour (autoscaling/v2 HorizontalPodAutoscalerBehavior), from the startup time.

    Up: at most double the replicas, or add one, per startup time: the replicas asked for in the
    last round are still loading and count as coming capacity, not as missing (AIBrix #2670's
    cascading scale-ups, llm-d's 1 -> 50 jump), while a real surge still grows exponentially
    (KubeAI #229's one pod at a time). Down: only after the load stayed low for twice a startup,
    one replica a minute: removing a replica that is needed again costs a whole startup (KubeAI #67).
    """
    up_period = min(autoscaling.scale_up_period_seconds or startup, MAX_POLICY_PERIOD)
    down_window = autoscaling.scale_down_stabilization_seconds
    if down_window is None:
        down_window = min(max(2 * startup, MIN_SCALE_DOWN_WINDOW), MAX_STABILIZATION)
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": up_period},
                {"type": "Pods", "value": 1, "periodSeconds": up_period},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": down_window,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
        },
    }


# -- queries -------------------------------------------------------------------------------------------


def _matchers(name: str, namespace: str, role: str | None = None) -> str:
    matchers = f'namespace="{namespace}",{RESOURCE_LABEL}="{name}"'
    return matchers if role is None else f'{matchers},{ROLE_TARGET_LABEL}="{role}"'


def running_query(name: str, namespace: str, role: str | None = None) -> str:
    """All running requests of one resource (every pod, every DP rank; of one P/D `role`): one element,
    KEDA's input."""
    return f"sum({RUNNING_METRIC}{{{_matchers(name, namespace, role)}}})"


def waiting_query(name: str, namespace: str, role: str | None = None) -> str:
    """All requests waiting in the engines' queues of one resource (of one P/D `role`)."""
    return f"sum({WAITING_METRIC}{{{_matchers(name, namespace, role)}}})"


def prefill_tokens_query(name: str, namespace: str) -> str:
    """The prompt tokens at the prefill engines of one P/D resource, queued or being prefilled, over
    every router replica (each counts its own requests) and every prefill engine, each series averaged
    over PREFILL_WINDOW: one long prompt is a spike of its own length for a step, not a load."""
    selector = f'{ROUTER_WORK_METRIC}{{{_matchers(name, namespace)},role="prefill"}}'
    return f"sum(avg_over_time({selector}[{PREFILL_WINDOW}]))"


def picker_queue_query(name: str, namespace: str) -> str:
    """Requests the endpoint picker holds for the resource's pool (what wakes a resource scaled to zero),
    over every fairness flow, priority and model; the series exist only where the picker's PodMonitor
    scrapes it (`routing.build_picker_pod_monitor`)."""
    return f'sum({PICKER_QUEUE_METRIC}{{namespace="{namespace}",inference_pool="{name}"}})'


# -- the ScaledObject ----------------------------------------------------------------------------------


def build_scaled_object(
    name: str,
    namespace: str,
    autoscaling: AutoscalingSpec,
    cap: Capacity,
    labels: Mapping[str, str],
    prometheus: str,
    startup: int,
    role: str | None = None,
) -> JSON:
    """The KEDA ScaledObject of one resource; `prometheus` is the operator's default address. With
    `role` (a P/D resource's decode role) the queries read that role's engines only."""
    target = targets(autoscaling, cap)
    server = _server(autoscaling, prometheus)
    triggers = [
        _trigger("running-requests", server, running_query(name, namespace, role), target.running),
        _trigger("waiting-requests", server, waiting_query(name, namespace, role), target.queue),
    ]
    if autoscaling.min_replicas == 0:
        # With no replica there are no vLLM series: the picker's held requests wake the resource.
        triggers.append(_trigger("held-requests", server, picker_queue_query(name, namespace), target.queue))
    down = behavior(autoscaling, startup)["scaleDown"]["stabilizationWindowSeconds"]
    spec: JSON = {
        "scaleTargetRef": {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": name},
        "minReplicaCount": autoscaling.min_replicas,
        "maxReplicaCount": autoscaling.max_replicas,
    }
    if autoscaling.min_replicas == 0:
        # Both only matter between 0 and 1 replica: KEDA's own loop polls the triggers to wake the
        # resource and waits cooldownPeriod before 1 -> 0 (as carefully as any scale-down); above
        # that the HPA reads KEDA's metrics server on its own schedule. With minReplicaCount >= 1
        # (and no idleReplicaCount, no useCachedMetrics) KEDA's webhook warns that they are not
        # relevant (v2.20.2 apis/keda/v1alpha1/scaledobject_webhook.go verifyScaledObjects).
        spec["pollingInterval"] = autoscaling.polling_interval_seconds
        spec["cooldownPeriod"] = down
    spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": behavior(autoscaling, startup)}}
    spec["triggers"] = triggers
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": SCALED_OBJECT_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
    }


def build_prefill_scaled_object(
    name: str,
    namespace: str,
    spec: NPUInferenceSpec,
    cap: PrefillCapacity,
    labels: Mapping[str, str],
    prometheus: str,
    startup: int,
) -> JSON:
    """The KEDA ScaledObject of a P/D resource's prefill role (`<name>-prefill`): its scale target is
    the role's DisaggregatedSetRoleScaler, its trigger the prompt tokens queued at prefill."""
    assert spec.autoscaling is not None
    target = prefill_target(spec, cap)
    server = _server(spec.autoscaling, prometheus)
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": SCALED_OBJECT_KIND,
        "metadata": {"name": PREFILL_SCALED_OBJECT.child_name(name), "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": DS_ROLE_SCALERS.api_version,
                "kind": DS_ROLE_SCALERS.kind,
                "name": role_scaler_name(name, "prefill"),
            },
            "minReplicaCount": target.min_replicas,
            "maxReplicaCount": target.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(spec.autoscaling, startup)}},
            "triggers": [
                _trigger("queued-prefill-tokens", server, prefill_tokens_query(name, namespace), target.queued_tokens)
            ],
        },
    }


def _server(autoscaling: AutoscalingSpec, prometheus: str) -> PrometheusSpec:
    return dataclasses.replace(autoscaling.prometheus, address=autoscaling.prometheus.address or prometheus)


def _trigger(name: str, prometheus: PrometheusSpec, query: str, threshold: int) -> JSON:
    # Every value a string: the CRD's triggers[].metadata is a map of strings.
    metadata = {
        "serverAddress": prometheus.address,
        "query": query,
        "threshold": str(threshold),
        "activationThreshold": "0",
        "ignoreNullValues": "true",
    }
    # KEDA's Prometheus scaler (pkg/scalers/prometheus_scaler.go prometheusMetadata): authModes is read
    # from the trigger's metadata, then from the TriggerAuthentication's parameters, as a comma-separated
    # list (pkg/scalers/authentication/authentication_types.go Config.Modes); the credentials (username
    # and password, bearerToken, ca, cert and key...) only from the TriggerAuthentication.
    if prometheus.auth_modes:
        metadata["authModes"] = ",".join(prometheus.auth_modes)
    if prometheus.unsafe_ssl:
        metadata["unsafeSsl"] = "true"
    trigger: JSON = {"type": "prometheus", "name": name, "metricType": "AverageValue", "metadata": metadata}
    if prometheus.authentication is not None:
        # triggers[].authenticationRef (keda.sh_scaledobjects.yaml v2.20.2): name, kind (enum).
        ref = prometheus.authentication
        trigger["authenticationRef"] = {"name": ref.name, "kind": ref.kind}
    return trigger


def autoscaling_status(autoscaling: AutoscalingSpec, cap: Capacity, startup_seen: int | None, timeout: int) -> JSON:
    """status.autoscaling: the targets in force and why; startupSeconds only once a startup was seen."""
    target = targets(autoscaling, cap)
    timing = (
        f"scaling pace from the startup seen ({startup_seen} s)"
        if startup_seen
        else f"scaling pace from engine.startupTimeoutSeconds ({timeout} s) until a replica is seen starting"
    )
    found: JSON = {
        "runningRequestsPerReplica": target.running,
        "queueDepthPerReplica": target.queue,
        "largestCapturedBatch": cap.largest_batch,
        "dataParallelRanks": cap.data_parallel,
        "reason": f"{target.reason}; {timing}",
    }
    if startup_seen:
        found["startupSeconds"] = startup_seen
    return found


def prefill_status(target: PrefillTarget) -> JSON:
    """status.autoscaling.prefill: the prefill role's target in force and why."""
    return {
        "queuedTokensPerReplica": target.queued_tokens,
        "batchedTokens": target.capacity.batched_tokens,
        "dataParallelRanks": target.capacity.data_parallel,
        "minReplicas": target.min_replicas,
        "maxReplicas": target.max_replicas,
        "reason": target.reason,
    }


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
