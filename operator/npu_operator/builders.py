"""Pure builders: an NPUInference spec (+ the operator's settings) in, child manifests out.

No client, no clock, no randomness: the same input gives byte-identical manifests, with maps
sorted and names derived from the resource's name. Owner references are added where the
children are applied (`reconcile`), because they need the owner's uid.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from typing import Any, Final

from npu_runtime.contract import (
    ASCEND_RECOMMENDED_ENV,
    DEFAULT_METRICS_PORT,
    DEFAULT_PORT,
    PlanOptions,
    ServeOptions,
    plan_argv,
    serve_argv,
)

from npu_operator import crd, routing, scaling
from npu_operator.api import HUB_MODEL_DIR, HUB_MODEL_PATH, NPUInferenceSpec
from npu_operator.calibration import RECORD_FILE, RECORD_MOUNT, configmap_name
from npu_operator.config import OperatorConfig

JSON = dict[str, Any]

HTTP_PORT: Final = DEFAULT_PORT
METRICS_PORT: Final = DEFAULT_METRICS_PORT
CONTAINER_NAME: Final = "runtime"
MODEL_VOLUME: Final = "model"
SHM_VOLUME: Final = "dshm"
# Hub sources: the init container that downloads into the cache volume and links the revision.
FETCH_CONTAINER_NAME: Final = "fetch-model"
MODEL_LINK_VOLUME: Final = "model-link"
# The resource's calibration record (a ConfigMap the status loop writes; optional: a missing one,
# or a missing file in it, means no record yet and the runtime plans from its estimates).
CALIBRATION_VOLUME: Final = "calibration"
TOKEN_ENV: Final = "NPU_MODEL_TOKEN"  # npu_runtime.fetch.download.TOKEN_ENV (the runtime is not imported for it)
CHIP_LABEL: Final = "node.kubernetes.io/npu.chip.name"
# The runtime drains in-flight requests on SIGTERM; the kubelet's grace period must cover it.
TERMINATION_GRACE_SECONDS: Final = 120
PROBE_PERIOD_SECONDS: Final = 10


# LeaderWorkerSet (kubernetes-sigs/lws): the API, and what it tells each pod of a group.
LWS_API_VERSION: Final = "leaderworkerset.x-k8s.io/v1"
LWS_KIND: Final = "LeaderWorkerSet"
LWS_LEADER_ADDRESS: Final = "LWS_LEADER_ADDRESS"  # the leader pod's DNS name, set in every pod of a group
LWS_WORKER_INDEX: Final = "LWS_WORKER_INDEX"  # 0 for the leader, 1.. for the workers
LWS_WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"  # the group, 0..replicas-1
# Target labels of every series of a multi-node replica's pods, from LeaderWorkerSet's pod labels:
# a panel can split replay latency and downgrades by group and node. A Deployment's pods have
# neither label, and Prometheus drops a target label whose value is empty.
RANK_TARGET_LABELS: Final = {"group": LWS_GROUP_INDEX_LABEL, "node_rank": LWS_WORKER_INDEX_LABEL}


def rank_relabelings() -> list[JSON]:
    """The PodMonitor endpoints' relabelings that copy RANK_TARGET_LABELS from Prometheus' pod metadata
    (`__meta_kubernetes_pod_label_<name>`, the name's other characters made underscores)."""
    return [
        {
            "action": "replace",
            "sourceLabels": ["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)],
            "targetLabel": target,
        }
        for target, label in RANK_TARGET_LABELS.items()
    ]


# The pod's own interface for HCCL's, Gloo's and the TP socket's bootstrap traffic, as vllm-ascend's
# multi-node tutorials export them (HCCL_IF_IP, GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME,
# HCCL_SOCKET_IFNAME). A pod's network is eth0; spec.engine.env overrides each one.
POD_INTERFACE: Final = "eth0"
SOCKET_IFNAME_ENV: Final = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What the cluster offers, found out by the caller (builders never ask the API)."""

    pod_monitor: bool = False
    scaled_object: bool = False  # keda.sh/v1alpha1
    inference_pool: bool = False  # inference.networking.k8s.io/v1
    http_route: bool = False  # gateway.networking.k8s.io/v1

    @classmethod
    def everything(cls) -> Capabilities:
        return cls(pod_monitor=True, scaled_object=True, inference_pool=True, http_route=True)


NAME_LABEL: Final = f"{crd.GROUP}/name"


def selector_labels(name: str) -> dict[str, str]:
    """The labels that select one NPUInference's pods (immutable in a Deployment: never change)."""
    return {"app.kubernetes.io/name": "npu-inference", NAME_LABEL: name}


def selector_string(name: str, *, multi_node: bool = False) -> str:
    """The scale subresource's selector (status.selector): the pods that count as replicas."""
    return ",".join(f"{k}={v}" for k, v in sorted(serving_pod_labels(name, multi_node=multi_node).items()))


def labels(name: str) -> dict[str, str]:
    return sorted_mapping(
        {
            **selector_labels(name),
            "app.kubernetes.io/instance": name,
            "app.kubernetes.io/managed-by": "npu-operator",
        }
    )


def endpoint(name: str, namespace: str) -> str:
    """The OpenAI base URL of the Service, inside the cluster."""
    return f"http://{name}.{namespace}.svc:{HTTP_PORT}/v1"


def build_children(
    name: str,
    namespace: str,
    spec: NPUInferenceSpec,
    config: OperatorConfig,
    capabilities: Capabilities = Capabilities(),
    startup_seconds: int | None = None,
) -> list[JSON]:
    """Every child the resource should have, in apply order.

    One node per replica: a Deployment. More: a LeaderWorkerSet, whether or not its API is
    installed (the caller reports a missing API; see `Capabilities`). `startup_seconds` is the
    startup seen so far (status.autoscaling.startupSeconds); None: the spec's startup timeout.
    With spec.disaggregation: the router, a DisaggregatedSet of the prefill and decode roles and
    their Services (`disaggregation`).
    """
    if spec.disaggregation is not None:
        from npu_operator import disaggregation  # it builds on this module

        return disaggregation.build_children(name, namespace, spec, config, capabilities.pod_monitor)
    workload = (
        build_leader_worker_set(name, namespace, spec, config)
        if spec.npu.nodes > 1
        else build_deployment(name, namespace, spec, config)
    )
    children = [workload, build_service(name, namespace, leaders_only=spec.npu.nodes > 1)]
    if spec.replicas > 1:
        children.append(build_pod_disruption_budget(name, namespace))
    if spec.pod_monitor.enabled and capabilities.pod_monitor:
        children.append(build_pod_monitor(name, namespace, spec))
    if spec.autoscaling is None and spec.routing is None:
        return children
    cap = scaling.capacity(spec, plan_options(spec))
    if spec.autoscaling is not None and capabilities.scaled_object:
        startup = startup_seconds or spec.engine.startup_timeout_seconds
        children.append(
            scaling.build_scaled_object(
                name, namespace, spec.autoscaling, cap, labels(name), config.prometheus_address, startup
            )
        )
    if spec.routing is not None and capabilities.inference_pool:
        pool = routing.Pool(
            name=name,
            namespace=namespace,
            labels=labels(name),
            pods=serving_pod_labels(name, multi_node=spec.npu.nodes > 1),
            max_concurrency=cap.per_replica,
            failure_mode=spec.routing.failure_mode,
        )
        children += routing.build_picker(pool, config.picker_image)
        children.append(routing.build_inference_pool(pool))
        if spec.routing.gateway is not None and capabilities.http_route:
            children.append(routing.build_http_route(pool, spec.routing.gateway))
    return children


def plan_options(spec: NPUInferenceSpec) -> PlanOptions:
    speculative = spec.engine.speculative
    return PlanOptions(
        graph_mode=spec.graph.mode,
        capture_sizes=spec.graph.capture_sizes,
        max_capture_size=spec.graph.max_capture_size,
        stream_budget=spec.graph.stream_budget,
        max_num_seqs=spec.engine.max_num_seqs,
        max_model_len=spec.engine.max_model_len,
        max_num_batched_tokens=spec.engine.max_num_batched_tokens,
        gpu_memory_utilization=spec.engine.gpu_memory_utilization,
        tensor_parallel=spec.parallelism.tensor,
        pipeline_parallel=spec.parallelism.pipeline,
        data_parallel=spec.parallelism.data,
        speculative_method=speculative.method if speculative else None,
        speculative_tokens=speculative.num_tokens if speculative else 0,
        speculative_model=speculative.model if speculative else None,
        dtype=spec.engine.dtype,
        enable_expert_parallel=spec.parallelism.expert,
        nodes=spec.npu.nodes,
        quantization=spec.engine.quantization,
    )


class KubeletReference(str):
    """An argument the kubelet is meant to expand: `$(NAME)` of a variable the operator itself
    sets (LeaderWorkerSet's). Every other argument and env value is a literal (`kubelet_literal`)."""


def kubelet_literal(value: str) -> str:
    """`value` as the kubelet must pass it on: every `$` doubled, so nothing a user wrote is
    expanded. The kubelet expands `$(NAME)` in args and env values from the container's env and
    turns `$$` into `$` (kubernetes v1.31, third_party/forked/golang/expansion/expand.go, Expand);
    doubling every `$` (not only `$(`) also keeps a user's own `$$(NAME)` literal."""
    if isinstance(value, KubeletReference):
        return str(value)
    return value.replace("$", "$$")


def _literal_container(container: JSON) -> JSON:
    """The one place where a container's args and env values become literals for the kubelet."""
    container["args"] = [kubelet_literal(arg) for arg in container.get("args", [])]
    for var in container.get("env", []):
        if "value" in var:
            var["value"] = kubelet_literal(var["value"])
    return container


def runtime_args(spec: NPUInferenceSpec) -> list[str]:
    """The container's args: `npu-runtime serve` with the serve contract's flags.

    A multi-node replica's pods all get the same args: the node rank and the leader's address
    come from LeaderWorkerSet's variables, which the kubelet expands in args ($(NAME)).
    """
    multi_node = spec.npu.nodes > 1
    options = ServeOptions(
        model=spec.model.path,
        served_model_name=spec.model.name,
        port=HTTP_PORT,
        metrics_port=METRICS_PORT,
        plan=dataclasses.replace(plan_options(spec), calibration=f"{RECORD_MOUNT}/{RECORD_FILE}"),
        # The runtime drains for this long after SIGTERM, then kills the engine: inside the grace period.
        shutdown_timeout=TERMINATION_GRACE_SECONDS - 10,
        extra_engine_args=spec.engine.extra_args,
        additional_config=(
            json.dumps(spec.engine.additional_config, sort_keys=True, separators=(",", ":"))
            if spec.engine.additional_config is not None
            else None
        ),
        data_parallel_address=KubeletReference(f"$({LWS_LEADER_ADDRESS})") if multi_node else None,
    )
    argv = serve_argv(options)
    if multi_node:
        argv[argv.index("--node-rank") + 1] = KubeletReference(f"$({LWS_WORKER_INDEX})")
    return ["npu-runtime", "serve", *argv]


# The runtime container's hardening (docs/security.md says why each setting is safe on Ascend):
# NPUs reach the container as device nodes that the device plugin allocates (device cgroup), which
# needs no capability; vllm-ascend's own container instructions pass `--device` only, never
# `--privileged` or `--cap-add`. Root stays allowed (the vllm-ascend images run as root, caches
# under /root) and the root filesystem stays writable (vLLM and CANN write caches and kernels).
RUNTIME_SECURITY_CONTEXT: Final = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "privileged": False,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def build_deployment(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": sorted_mapping(selector_labels(name))},
            # NPUs are scarce and whole: a surge pod would wait for NPUs that the old pod holds.
            # Replace one pod at a time instead.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            # A rollout may legitimately take a whole startup (weights plus graph capture).
            "progressDeadlineSeconds": spec.engine.startup_timeout_seconds + 600,
            "revisionHistoryLimit": 5,
            "template": _pod_template(name, spec, config),
        },
    }


def build_leader_worker_set(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    """A LeaderWorkerSet with one group of spec.npu.nodes pods per replica.

    Every pod runs the same `npu-runtime serve` (see `runtime_args`): the leader (worker index 0)
    starts vLLM's API server and its local data-parallel ranks, the workers their ranks headless.
    The workers are created with the leader (startupPolicy LeaderCreated: the leader only becomes
    ready once they have joined), and a group is recreated whole when one pod restarts, since the
    engine's data-parallel group cannot take a member back.
    """
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                # As for the Deployment: no surge group, whose NPUs the old group holds.
                "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "leaderWorkerTemplate": {
                "size": spec.npu.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": _pod_template(name, spec, config),
            },
        },
    }


def _pod_template(name: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    template = spec.template
    pod_spec: JSON = {
        "containers": [_literal_container(_container(spec, config))],
        "volumes": [*_volumes(spec), calibration_volume(name)],
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        # Service links put one variable per Service into every pod; vLLM reads VLLM_PORT, which a
        # Service named "vllm" would set to tcp://..., so keep them out.
        "enableServiceLinks": False,
        # The runtime never calls the Kubernetes API: no token unless the spec names an account.
        "automountServiceAccountToken": template.service_account_name is not None,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    node_selector = dict(template.node_selector)
    if spec.npu.chip_name:
        node_selector[CHIP_LABEL] = spec.npu.chip_name
    optional: JSON = {
        "nodeSelector": sorted_mapping(node_selector) if node_selector else None,
        "tolerations": list(template.tolerations) or None,
        "affinity": template.affinity,
        "schedulerName": template.scheduler_name,
        "priorityClassName": template.priority_class_name,
        "serviceAccountName": template.service_account_name,
        "imagePullSecrets": [{"name": secret} for secret in template.image_pull_secrets] or None,
    }
    pod_spec.update({key: value for key, value in optional.items() if value is not None})
    if spec.model.hub is not None:
        pod_spec["initContainers"] = [_literal_container(_fetch_container(spec, config))]
    pod_metadata: JSON = {"labels": sorted_mapping({**template.labels, **labels(name)})}
    if template.annotations:
        pod_metadata["annotations"] = sorted_mapping(dict(template.annotations))
    return {"metadata": pod_metadata, "spec": pod_spec}


def _container(spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    startup_checks = math.ceil(spec.engine.startup_timeout_seconds / PROBE_PERIOD_SECONDS)
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": spec.engine.image or config.runtime_image,
        # args, never command: the vllm-ascend images' entrypoint sources the CANN environment
        # and then execs its arguments.
        "args": runtime_args(spec),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "env": _env(spec),
        "resources": _resources(spec, config),
        "volumeMounts": _volume_mounts(spec),
        # Weight loading plus graph capture: readiness of the engine, for as long as the spec allows.
        "startupProbe": probe("/readyz", period=PROBE_PERIOD_SECONDS, failures=startup_checks),
        "readinessProbe": probe("/readyz", period=PROBE_PERIOD_SECONDS, failures=3),
        # Liveness asks the runtime (alive, engine process alive), never the busy engine itself.
        "livenessProbe": probe("/healthz", period=15, failures=4),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(RUNTIME_SECURITY_CONTEXT),
    }
    if spec.engine.image_pull_policy:
        container["imagePullPolicy"] = spec.engine.image_pull_policy
    return container


def fetch_args(spec: NPUInferenceSpec) -> list[str]:
    """The init container's args: `npu-runtime fetch` of the hub source into the cache, then the plan."""
    hub = spec.model.hub
    if hub is None:
        raise ValueError("spec.model.source has no huggingFace or modelScope repository")
    args = ["npu-runtime", "fetch", "--hub", hub.hub, "--repo", hub.repository]
    if hub.revision:
        args += ["--revision", hub.revision]
    args += ["--cache", spec.model.mount_path]
    for pattern in hub.allow_patterns:
        args += ["--allow", pattern]
    for pattern in hub.ignore_patterns:
        args += ["--ignore", pattern]
    if hub.endpoint:
        args += ["--endpoint", hub.endpoint]
    if hub.send_token_over_http:
        args += ["--send-token-over-http"]
    if hub.hold:
        args += ["--hold"]
    args += ["--link", HUB_MODEL_PATH, "--status-port", str(METRICS_PORT)]
    # Planned as soon as config.json is in the cache: a model that cannot fit fails before its weights come.
    return [*args, "--plan", *plan_argv(plan_options(spec))]


def _fetch_container(spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    hub = spec.model.hub
    assert hub is not None
    env: list[JSON] = [
        {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if hub.token is not None:  # from the Secret, never in args
        env.append({"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": hub.token.name, "key": hub.token.key}}})
    container: JSON = {
        "name": FETCH_CONTAINER_NAME,
        "image": spec.engine.image or config.runtime_image,
        "args": fetch_args(spec),
        "env": sorted(env, key=lambda var: var["name"]),
        # The same NPUs as the serving container (the device plugin hands them on): the early plan
        # probes the device the model will run on.
        "resources": _resources(spec, config),
        "volumeMounts": [
            {"name": MODEL_VOLUME, "mountPath": spec.model.mount_path},
            {"name": MODEL_LINK_VOLUME, "mountPath": HUB_MODEL_DIR},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(RUNTIME_SECURITY_CONTEXT),
    }
    if spec.engine.image_pull_policy:
        container["imagePullPolicy"] = spec.engine.image_pull_policy
    return container


def probe(path: str, *, period: int, failures: int) -> JSON:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def host_network_env() -> dict[str, JSON]:
    """HCCL_IF_IP (the pod's IP) and the *_SOCKET_IFNAME variables (the pod's interface), by name:
    what multi-node engines and vllm-ascend's P/D roles export to find each other."""
    env: dict[str, JSON] = {
        "HCCL_IF_IP": {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    }
    for key in SOCKET_IFNAME_ENV:
        env[key] = {"name": key, "value": POD_INTERFACE}
    return env


def _env(spec: NPUInferenceSpec) -> list[JSON]:
    env: dict[str, JSON] = {key: {"name": key, "value": value} for key, value in ASCEND_RECOMMENDED_ENV.items()}
    if spec.npu.nodes > 1:
        env.update(host_network_env())
    for var in spec.engine.env:
        env[var["name"]] = dict(var)
    return [env[key] for key in sorted(env)]


def _resources(spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    requests = dict(spec.resources.get("requests", {}))
    limits = dict(spec.resources.get("limits", {}))
    if spec.npu.count > 0:
        # Extended resources cannot be overcommitted: the request must equal the limit.
        resource = spec.npu.resource_name or config.npu_resource_name
        requests[resource] = limits[resource] = spec.npu.count
    result: JSON = {}
    if limits:
        result["limits"] = sorted_mapping(limits)
    if requests:
        result["requests"] = sorted_mapping(requests)
    return result


def _volumes(spec: NPUInferenceSpec) -> list[JSON]:
    model = spec.model
    shm: JSON = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.engine.shm_size}}
    if model.hub is not None and model.cache is not None:
        return [
            {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": model.cache.claim_name}},
            {"name": MODEL_LINK_VOLUME, "emptyDir": {}},
            shm,
        ]
    if model.claim is not None:
        source: JSON = {
            "persistentVolumeClaim": {"claimName": model.claim.claim_name, "readOnly": model.claim.read_only}
        }
    elif model.host_path is not None:
        host_path: JSON = {"path": model.host_path.path}
        if model.host_path.type:
            host_path["type"] = model.host_path.type
        source = {"hostPath": host_path}
    else:  # the CRD requires exactly one source; parse_spec keeps whatever was stored
        raise ValueError("spec.model.source needs persistentVolumeClaim, hostPath, huggingFace or modelScope")
    return [{"name": MODEL_VOLUME, **source}, shm]


def _volume_mounts(spec: NPUInferenceSpec) -> list[JSON]:
    model_mount: JSON = {"name": MODEL_VOLUME, "mountPath": spec.model.mount_path, "readOnly": True}
    if spec.model.claim is not None and spec.model.claim.sub_path:
        model_mount["subPath"] = spec.model.claim.sub_path
    mounts = [
        model_mount,
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": CALIBRATION_VOLUME, "mountPath": RECORD_MOUNT, "readOnly": True},
    ]
    if spec.model.hub is not None:
        mounts.append({"name": MODEL_LINK_VOLUME, "mountPath": HUB_MODEL_DIR, "readOnly": True})
    return mounts


def calibration_volume(name: str) -> JSON:
    """The calibration record's ConfigMap as an optional volume: the pods start before it exists.
    A directory mount (no subPath), so the kubelet keeps it current for the next restart."""
    return {"name": CALIBRATION_VOLUME, "configMap": {"name": configmap_name(name), "optional": True}}


def build_cache_claim(namespace: str, spec: NPUInferenceSpec) -> JSON | None:
    """The shared cache's PersistentVolumeClaim, when the spec asks the operator to create it.

    Not owned by the resource: other resources share the cache, and deleting one must not delete
    the downloads of all.
    """
    cache = spec.model.cache
    if cache is None or cache.create is None:
        return None
    claim_spec: JSON = {
        "accessModes": [cache.create.access_mode],
        "resources": {"requests": {"storage": cache.create.size}},
    }
    if cache.create.storage_class_name:
        claim_spec["storageClassName"] = cache.create.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": cache.claim_name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "npu-operator", "app.kubernetes.io/part-of": "npu-inference"},
        },
        "spec": claim_spec,
    }


def serving_pod_labels(name: str, *, multi_node: bool) -> dict[str, str]:
    """The labels of the pods that serve the API, one per replica: every pod of a one-node replica, the
    leader (LeaderWorkerSet's worker index 0) of a multi-node one. The Service, the InferencePool
    and the scale subresource's selector (status.selector) all select these."""
    selector = selector_labels(name)
    if multi_node:
        selector[LWS_WORKER_INDEX_LABEL] = "0"
    return sorted_mapping(selector)


def build_service(name: str, namespace: str, *, leaders_only: bool = False) -> JSON:
    """The endpoint. For a LeaderWorkerSet only the leaders serve the API: the selector adds
    LeaderWorkerSet's worker-index label 0."""
    selector = serving_pod_labels(name, multi_node=leaders_only)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {
            "type": "ClusterIP",
            "selector": sorted_mapping(selector),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_pod_disruption_budget(name: str, namespace: str) -> JSON:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": sorted_mapping(selector_labels(name))}},
    }


def build_pod_monitor(name: str, namespace: str, spec: NPUInferenceSpec) -> JSON:
    interval = spec.pod_monitor.interval
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": sorted_mapping({**spec.pod_monitor.labels, **labels(name)}),
        },
        "spec": {
            "selector": {"matchLabels": sorted_mapping(selector_labels(name))},
            # Every series gets the resource's name as `inference_npu_dev_name` (prometheus-operator
            # makes the label name valid): what the chart's dashboard and alerts group by.
            "podTargetLabels": [NAME_LABEL],
            "podMetricsEndpoints": [
                # npu_graph_* and npu_device_* from the runtime; vllm:* from the engine itself.
                {"port": "metrics", "path": "/metrics", "interval": interval, "relabelings": rank_relabelings()},
                {"port": "http", "path": "/metrics", "interval": interval, "relabelings": rank_relabelings()},
            ],
        },
    }


def sorted_mapping(mapping: dict[str, Any]) -> dict[str, Any]:
    return {key: mapping[key] for key in sorted(mapping)}
