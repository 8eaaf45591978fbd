"""The engine pod's template: container, init container, env, volumes, probes, args. Pure.

An NPUInference spec (+ the operator's settings) in, a pod template out; every workload
(`workloads`, `disaggregated`) runs its engines from it. No client, no clock, no randomness: the
same input gives byte-identical manifests, with maps sorted.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any, Final

from npu_runtime.contract import (
    ASCEND_RECOMMENDED_ENV,
    KV_EVENTS_HASH_SEED,
    KV_EVENTS_HASH_SEED_ENV,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    ServeOptions,
    plan_argv,
    serve_argv,
)

from npu_operator.api import clusters
from npu_operator.api.config import OperatorConfig
from npu_operator.api.host_mounts import HostMount
from npu_operator.api.spec import HUB_MODEL_DIR, HUB_MODEL_PATH, SHM_MOUNT, NPUInferenceSpec, plan_options
from npu_operator.children import lora
from npu_operator.children.kinds import CALIBRATION_RECORD
from npu_operator.kube.names import (
    CONTAINER_NAME,
    FETCH_CONTAINER_NAME,
    HTTP_PORT,
    LWS_LEADER_ADDRESS,
    LWS_WORKER_INDEX,
    METRICS_PORT,
    RECORD_FILE,
    RECORD_MOUNT,
    labels,
    sorted_mapping,
)

JSON = dict[str, Any]


MODEL_VOLUME: Final = "model"

SHM_VOLUME: Final = "dshm"

MODEL_LINK_VOLUME: Final = "model-link"

# The resource's calibration record (a ConfigMap the operator creates before the workload and the
# status loop writes; optional: a missing one, or a missing file in it, means no record yet and
# the runtime plans from its estimates).
CALIBRATION_VOLUME: Final = "calibration"

TOKEN_ENV: Final = "NPU_MODEL_TOKEN"  # npu_runtime.fetch.download.TOKEN_ENV (the runtime is not imported for it)

# The runtime drains in-flight requests on SIGTERM; the kubelet's grace period must cover it.
TERMINATION_GRACE_SECONDS: Final = 120

PROBE_PERIOD_SECONDS: Final = 10

# The pod's own interface for HCCL's, Gloo's and the TP socket's bootstrap traffic, as vllm-ascend's
# multi-node tutorials export them (HCCL_IF_IP, GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME,
# HCCL_SOCKET_IFNAME). A pod's network is eth0; spec.engine.env overrides each one.
POD_INTERFACE: Final = "eth0"

SOCKET_IFNAME_ENV: Final = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")

# What vllm-ascend's multi-node and P/D tutorials export on every node besides the network (30 of
# its tutorials, e.g. docs/source/tutorials/models/DeepSeek-R1.md): OpenMP threads not pinned, so
# that the engine's own CPU binding decides.
SPREAD_NODES_ENV: Final = {"OMP_PROC_BIND": "false"}


# spec.cacheAwareRouting.kvEvents: the engines' KV events, under llm-d's topic "kv@<address>:<port>@<model>"
# (llm-d/llm-d-kv-cache pkg/kvevents/engineadapter/common.go parseTopic, vllm_adapter.go ParseMessage: the
# pod identifier is the topic's middle part, which llm-d-router v0.9.0's precise prefix cache producer
# matches against each endpoint's "address:port", requestcontrol/dataproducer/preciseprefixcache/
# producer.go produceFromBlockKeys), the pod's address from the downward API. PYTHONHASHSEED seeds the
# block hashes (npu_runtime.contract.KV_EVENTS_HASH_SEED, in KV_EVENTS_HASH_SEED_ENV).
POD_IP_ENV: Final = "POD_IP"
KV_EVENTS_PORT_NAME: Final = "kv-events"
KV_REPLAY_PORT_NAME: Final = "kv-replay"


def kv_events_topic(spec: NPUInferenceSpec) -> KubeletReference:
    """The engines' ZMQ topic: the kubelet expands the pod's address; the model's name stays literal."""
    return KubeletReference(f"kv@$({POD_IP_ENV}):{HTTP_PORT}@{kubelet_literal(spec.model.name)}")


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
        lora_adapters=lora.LIST_FILE if spec.lora is not None else None,
        kv_events_topic=kv_events_topic(spec) if spec.kv_events else None,
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


def pod_template(name: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
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
    cluster = clusters.profile(config)
    node_selector = dict(template.node_selector)
    if spec.npu.chip_name:
        node_selector[clusters.CHIP_LABEL] = spec.npu.chip_name
    scheduler_name = template.scheduler_name
    if spec.npu.count > 0:
        add_host_mounts(pod_spec, cluster.host_mounts)
        scheduler_name = scheduler_name or cluster.scheduler_name
        if accelerator_type := cluster.accelerator_types.get(clusters.spec_family(spec)):
            node_selector.setdefault(clusters.ACCELERATOR_TYPE_LABEL, accelerator_type)
    optional: JSON = {
        "nodeSelector": sorted_mapping(node_selector) if node_selector else None,
        "tolerations": list(template.tolerations) or None,
        "affinity": template.affinity,
        "schedulerName": scheduler_name,
        "runtimeClassName": (config.runtime_class_name or None) if spec.npu.count > 0 else None,
        "priorityClassName": template.priority_class_name,
        "serviceAccountName": template.service_account_name,
        "imagePullSecrets": [{"name": secret} for secret in template.image_pull_secrets] or None,
    }
    pod_spec.update({key: value for key, value in optional.items() if value is not None})
    if spec.model.hub is not None:
        pod_spec["initContainers"] = [_literal_container(_fetch_container(spec, config))]
    lora.add_lora_volumes(pod_spec, name, spec)
    pod_metadata: JSON = {"labels": sorted_mapping({**template.labels, **labels(name)})}
    if template.annotations:
        pod_metadata["annotations"] = sorted_mapping(dict(template.annotations))
    return {"metadata": pod_metadata, "spec": pod_spec}


def _container(spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    startup_checks = math.ceil(spec.engine.startup_timeout_seconds / PROBE_PERIOD_SECONDS)
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": clusters.runtime_image(spec, config),
        # args, never command: the vllm-ascend images' entrypoint sources the CANN environment
        # and then execs its arguments.
        "args": runtime_args(spec),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            # The first DP rank's; rank r publishes on these plus r (npu_runtime.contract.KV_EVENTS_PORT).
            *(
                [
                    {"name": KV_EVENTS_PORT_NAME, "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
                    {"name": KV_REPLAY_PORT_NAME, "containerPort": KV_REPLAY_PORT, "protocol": "TCP"},
                ]
                if spec.kv_events
                else []
            ),
        ],
        "env": _env(spec, config),
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
    if spec.lora is not None:  # then the list's hub adapters, into its cache
        args += ["--adapters", lora.LIST_FILE]
    args += ["--link", HUB_MODEL_PATH, "--status-port", str(METRICS_PORT)]
    # Planned as soon as config.json is in the cache: a model that cannot fit fails before its weights come.
    return [*args, "--plan", *plan_argv(plan_options(spec))]


def _fetch_container(spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    hub = spec.model.hub
    assert hub is not None
    # No progress bars in the init container's log (its progress is status.model): huggingface_hub's
    # switch, and tqdm's own for modelscope_hub, which has none (tqdm >= 4.66 reads TQDM_* defaults).
    env: list[JSON] = [
        {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        {"name": "TQDM_DISABLE", "value": "1"},
    ]
    if hub.token is not None:  # from the Secret, never in args
        env.append({"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": hub.token.name, "key": hub.token.key}}})
    container: JSON = {
        "name": FETCH_CONTAINER_NAME,
        "image": clusters.runtime_image(spec, config),
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
    """HCCL_IF_IP (the pod's IP), the *_SOCKET_IFNAME variables (the pod's interface) and
    OMP_PROC_BIND, by name: what multi-node engines and vllm-ascend's P/D roles export."""
    env: dict[str, JSON] = {
        "HCCL_IF_IP": {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    }
    for key in SOCKET_IFNAME_ENV:
        env[key] = {"name": key, "value": POD_INTERFACE}
    for key, value in SPREAD_NODES_ENV.items():
        env[key] = {"name": key, "value": value}
    return env


def _env(spec: NPUInferenceSpec, config: OperatorConfig) -> list[JSON]:
    env: dict[str, JSON] = {key: {"name": key, "value": value} for key, value in ASCEND_RECOMMENDED_ENV.items()}
    if spec.npu.nodes > 1:
        env.update(host_network_env())
    device_env = clusters.profile(config).device_annotation_env
    if device_env and spec.npu.count > 0:
        annotation = clusters.npu_resource(spec, config)
        env[device_env] = {
            "name": device_env,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}},
        }
    for var in spec.engine.env:
        env[var["name"]] = dict(var)
    if spec.kv_events:  # after the user's: validation refuses their PYTHONHASHSEED
        env[POD_IP_ENV] = {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        env[KV_EVENTS_HASH_SEED_ENV] = {"name": KV_EVENTS_HASH_SEED_ENV, "value": KV_EVENTS_HASH_SEED}
    return [env[key] for key in sorted(env)]


def _resources(spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    requests = dict(spec.resources.get("requests", {}))
    limits = dict(spec.resources.get("limits", {}))
    if spec.npu.count > 0:
        # Extended resources cannot be overcommitted: the request must equal the limit.
        resource = clusters.npu_resource(spec, config)
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


def add_host_mounts(pod_spec: JSON, mounts: tuple[HostMount, ...]) -> None:
    """The operator's own host paths into a pod spec built by `pod_template`: a hostPath volume and a
    read-only mount in the engine container each, once (a path already there is left as it is)."""
    container = pod_spec["containers"][0]
    for mount in mounts:
        if all(volume["name"] != mount.volume for volume in pod_spec["volumes"]):
            pod_spec["volumes"].append({"name": mount.volume, "hostPath": {"path": mount.path, "type": mount.type}})
            container["volumeMounts"].append({"name": mount.volume, "mountPath": mount.path, "readOnly": True})


def _volume_mounts(spec: NPUInferenceSpec) -> list[JSON]:
    model_mount: JSON = {"name": MODEL_VOLUME, "mountPath": spec.model.mount_path, "readOnly": True}
    if spec.model.claim is not None and spec.model.claim.sub_path:
        model_mount["subPath"] = spec.model.claim.sub_path
    mounts = [
        model_mount,
        {"name": SHM_VOLUME, "mountPath": SHM_MOUNT},
        {"name": CALIBRATION_VOLUME, "mountPath": RECORD_MOUNT, "readOnly": True},
    ]
    if spec.model.hub is not None:
        mounts.append({"name": MODEL_LINK_VOLUME, "mountPath": HUB_MODEL_DIR, "readOnly": True})
    return mounts


def without_calibration_record(pod_spec: JSON) -> None:
    """Takes the calibration record out of a pod spec built by `pod_template`: its volume, its mount
    and the `--calibration` flag (a P/D resource's record is the decode role's; prefill pods have none)."""
    pod_spec["volumes"] = [v for v in pod_spec["volumes"] if v["name"] != CALIBRATION_VOLUME]
    for container in pod_spec["containers"]:
        container["volumeMounts"] = [m for m in container.get("volumeMounts", []) if m["name"] != CALIBRATION_VOLUME]
        args = container.get("args", [])
        if "--calibration" in args:
            at = args.index("--calibration")
            container["args"] = [*args[:at], *args[at + 2 :]]


def calibration_volume(name: str) -> JSON:
    """The calibration record's ConfigMap as an optional volume: it holds no record until the pods agree.
    A directory mount (no subPath), so the kubelet keeps it current for the next restart."""
    return {"name": CALIBRATION_VOLUME, "configMap": {"name": CALIBRATION_RECORD.child_name(name), "optional": True}}
