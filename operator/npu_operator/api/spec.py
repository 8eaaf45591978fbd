"""The typed view of an NPUInference spec, and what the runtime's planner is asked from it.

`parse_spec` applies the CRD's own defaults (see `crd`) before reading, so a default lives in
one place: the CRD file. What the schema lets through but cannot be served is `validation`'s.
`plan_options` is the one translation of a spec into the runtime's planner options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from npu_runtime.contract import PlanOptions

from npu_operator.api import crd
from npu_operator.api.host_mounts import HOST_MOUNTS

JSON = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ClaimSource:
    claim_name: str
    sub_path: str | None
    read_only: bool


@dataclasses.dataclass(frozen=True)
class HostPathSource:
    path: str
    type: str


@dataclasses.dataclass(frozen=True)
class SecretKey:
    name: str
    key: str


@dataclasses.dataclass(frozen=True)
class HubSource:
    """A repository on Hugging Face (hub "huggingface") or ModelScope (hub "modelscope")."""

    hub: str
    repository: str
    revision: str | None  # None: the hub's main branch
    allow_patterns: tuple[str, ...]
    ignore_patterns: tuple[str, ...]
    token: SecretKey | None
    endpoint: str | None
    send_token_over_http: bool = False  # the token may go to a plain http:// endpoint
    # Not a spec field: set by `revisions` while a rollout's branch is resolved (the fetch holds the pod).
    hold: bool = False


@dataclasses.dataclass(frozen=True)
class CacheClaimTemplate:
    storage_class_name: str | None
    size: str
    access_mode: str


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    claim_name: str
    create: CacheClaimTemplate | None


# With a hub source the init container links the downloaded revision here (an emptyDir per pod).
HUB_MODEL_DIR: Final = "/var/run/npu-model"
HUB_MODEL_PATH: Final = f"{HUB_MODEL_DIR}/model"
HUB_SOURCE_FIELDS: Final = {"huggingFace": "huggingface", "modelScope": "modelscope"}
# The engine pod's own mounts, besides the model's: a model mounted at one of these paths would be a
# second volume at the same path, which the API server refuses for the whole pod template.
SHM_MOUNT: Final = "/dev/shm"
RECORD_MOUNT: Final = "/etc/npu-runtime/calibration"  # the calibration record (a ConfigMap, read-only)
LORA_LIST_MOUNT: Final = "/etc/npu-runtime/lora"  # the adapter list (a ConfigMap, read-only)
LORA_DIR: Final = "/var/run/npu-lora"  # the adapters' volumes and their hub cache
POD_MOUNTS: Final = {
    SHM_MOUNT: "the engine's shared memory",
    LORA_LIST_MOUNT: "the LoRA adapter list",
    LORA_DIR: "the LoRA adapters",
    RECORD_MOUNT: "the calibration record",
    HUB_MODEL_DIR: "the downloaded revision's link",
    **{mount.path: f"the host's {mount.path}" for mount in HOST_MOUNTS},
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str  # with a hub source: HUB_MODEL_PATH
    mount_path: str
    claim: ClaimSource | None
    host_path: HostPathSource | None
    hub: HubSource | None = None
    cache: CacheSpec | None = None


@dataclasses.dataclass(frozen=True)
class NPUSpec:
    resource_name: str | None  # None: the operator's default
    count: int  # per node
    chip_name: str | None
    nodes: int = 1  # per replica: more than one makes a LeaderWorkerSet
    family: str | None = None  # None: from the chip or the resource (api.clusters.spec_family)


@dataclasses.dataclass(frozen=True)
class ParallelismSpec:
    tensor: int
    pipeline: int
    data: int  # over all nodes of a replica
    expert: bool = False


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    mode: str
    capture_sizes: tuple[int, ...] | None
    max_capture_size: int | None
    stream_budget: int | None
    on_downgrade: str  # Allow | Degrade


@dataclasses.dataclass(frozen=True)
class SpeculativeSpec:
    method: str
    num_tokens: int
    model: str | None


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    image: str | None  # None: the operator's default
    image_pull_policy: str | None
    max_num_seqs: int
    max_model_len: int | None
    gpu_memory_utilization: float
    dtype: str
    speculative: SpeculativeSpec | None
    extra_args: tuple[str, ...]
    env: tuple[JSON, ...]
    startup_timeout_seconds: int
    shm_size: str
    max_num_batched_tokens: int | None = None  # None: planned
    quantization: str | None = None  # None: detected from the checkpoint by the runtime
    additional_config: JSON | None = None  # vllm-ascend's --additional-config


@dataclasses.dataclass(frozen=True)
class PodTemplateSpec:
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_selector: Mapping[str, str]
    tolerations: tuple[JSON, ...]
    affinity: JSON | None
    scheduler_name: str | None
    priority_class_name: str | None
    service_account_name: str | None
    image_pull_secrets: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PodMonitorSpec:
    enabled: bool
    interval: str
    labels: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class PrefillSpec:
    """The prefill role of a disaggregated resource (model, image, dtype, quantization: the decode role's)."""

    replicas: int
    npu_count: int  # per node
    nodes: int
    parallelism: ParallelismSpec
    graph_mode: str
    max_num_seqs: int
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float
    additional_config: JSON | None
    extra_args: tuple[str, ...]
    env: tuple[JSON, ...]
    min_replicas: int = 1  # with spec.autoscaling
    max_replicas: int | None = None  # with spec.autoscaling; None: spec.autoscaling.maxReplicas


@dataclasses.dataclass(frozen=True)
class ConnectorSpec:
    name: str
    port: int | None  # None: above AscendDirectTransport's range for the roles' NPUs per node
    extra_config: JSON


@dataclasses.dataclass(frozen=True)
class RouterSpec:
    replicas: int
    timeout_seconds: int
    retries: int


# spec.disaggregation.decode.dataParallel: one API server over a decode replica's ranks (vLLM's
# internal load balancing) or one per rank behind the router (external: vllm-ascend's P/D tutorial).
DATA_PARALLEL_INTERNAL: Final = "internal"
DATA_PARALLEL_EXTERNAL: Final = "external"


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """How the decode role lays out its data-parallel ranks (`docs/disaggregation.md`, "Two layouts")."""

    data_parallel: str = DATA_PARALLEL_INTERNAL

    @property
    def external(self) -> bool:
        return self.data_parallel == DATA_PARALLEL_EXTERNAL


@dataclasses.dataclass(frozen=True)
class DisaggregationSpec:
    """Prefill/decode disaggregation: the spec's workload is the decode role, this adds the rest."""

    prefill: PrefillSpec
    connector: ConnectorSpec
    router: RouterSpec
    decode: DecodeSpec = DecodeSpec()


@dataclasses.dataclass(frozen=True)
class AuthenticationRef:
    """A KEDA TriggerAuthentication (same namespace) or ClusterTriggerAuthentication, by name."""

    name: str
    kind: str  # TriggerAuthentication | ClusterTriggerAuthentication


@dataclasses.dataclass(frozen=True)
class PrometheusSpec:
    """spec.autoscaling.prometheus: where KEDA queries, and how it authenticates."""

    address: str | None = None  # None: the operator's setting
    authentication: AuthenticationRef | None = None
    auth_modes: tuple[str, ...] = ()  # KEDA's authModes: basic, bearer, tls, custom, oauth, apiKey
    unsafe_ssl: bool = False


@dataclasses.dataclass(frozen=True)
class AutoscalingSpec:
    """spec.autoscaling: a KEDA ScaledObject on the resource's scale subresource (see `scaling`)."""

    min_replicas: int  # 0: scale to zero (needs spec.routing)
    max_replicas: int
    target_utilization: int  # percent of the plan's per-replica capacity
    running_requests_per_replica: int | None  # None: from the plan
    queue_depth_per_replica: int | None  # None: the running target
    scale_up_period_seconds: int | None  # None: the observed startup time
    scale_down_stabilization_seconds: int | None  # None: from the observed startup time
    polling_interval_seconds: int  # with minReplicas 0 only (KEDA's 0 <-> 1)
    prometheus: PrometheusSpec = PrometheusSpec()


@dataclasses.dataclass(frozen=True)
class GatewayRef:
    """spec.routing.gateway: the Gateway the HTTPRoute attaches to, and the hosts it answers for."""

    name: str
    namespace: str | None  # None: the resource's
    section_name: str | None
    hostnames: tuple[str, ...] = ()  # the HTTPRoute's spec.hostnames (none: every host the listener takes)


@dataclasses.dataclass(frozen=True)
class RoutingSpec:
    """spec.routing: an InferencePool and its endpoint picker (see `routing`)."""

    failure_mode: str  # FailOpen | FailClose
    gateway: GatewayRef | None
    request_timeout_seconds: int = 600  # one completion on a serving pod (the route's backendRequest timeout)


@dataclasses.dataclass(frozen=True)
class LoraAdapterSpec:
    """One of spec.lora.adapters: a served name and exactly one source (the CRD requires one)."""

    name: str
    hub: HubSource | None = None  # huggingFace / modelScope: repository, revision, endpoint only
    claim_name: str | None = None  # persistentVolumeClaim
    host_path: str | None = None  # hostPath
    sub_path: str = ""  # the adapter's directory in the claim or host directory


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """spec.lora: the engine's LoRA limits (planned, and part of the pod template) and the adapters
    (served from a ConfigMap the pods re-read: a changed list loads and unloads without a restart)."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int | None
    adapters: tuple[LoraAdapterSpec, ...]


@dataclasses.dataclass(frozen=True)
class CacheAwareRoutingSpec:
    """spec.cacheAwareRouting: requests go where their prompt's prefix is cached. With kv_events the
    engines publish their KV cache events (`npu_runtime.kv_events`) and the P/D router and the endpoint
    picker follow them; without, both estimate from the prompts they have routed."""

    kv_events: bool = True


@dataclasses.dataclass(frozen=True)
class NPUInferenceSpec:
    model: ModelSpec
    replicas: int
    npu: NPUSpec
    parallelism: ParallelismSpec
    graph: GraphSpec
    engine: EngineSpec
    resources: JSON  # requests/limits of cpu, memory, ephemeral-storage, as written
    template: PodTemplateSpec
    pod_monitor: PodMonitorSpec
    autoscaling: AutoscalingSpec | None = None
    routing: RoutingSpec | None = None
    disaggregation: DisaggregationSpec | None = None
    lora: LoraSpec | None = None
    cache_aware_routing: CacheAwareRoutingSpec | None = None

    @property
    def kv_events(self) -> bool:
        """The engines publish their KV cache events (spec.cacheAwareRouting.kvEvents)."""
        return self.cache_aware_routing is not None and self.cache_aware_routing.kv_events


class SpecError(ValueError):
    """The spec cannot be served as written. `field` is the spec path, e.g. spec.npu.resourceName."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def parse_spec(spec: Mapping[str, Any]) -> NPUInferenceSpec:
    """The typed spec, with the CRD's defaults applied. Raises SpecError on a missing required field."""
    s = crd.apply_defaults({"spec": dict(spec)})["spec"]
    try:
        return _parse(s)
    except KeyError as exc:
        raise SpecError(f"spec.{exc.args[0]}", "is required") from None


def _parse(s: JSON) -> NPUInferenceSpec:
    model, source = s["model"], s["model"].get("source", {})
    claim = source.get("persistentVolumeClaim")
    host = source.get("hostPath")
    hub = _hub_source(source)
    engine, graph, template = s["engine"], s["graph"], s["template"]
    speculative = engine.get("speculative")
    monitor = s["metrics"]["podMonitor"]
    return NPUInferenceSpec(
        model=ModelSpec(
            name=model["name"],
            path=HUB_MODEL_PATH if hub else model["path"],
            mount_path=model["mountPath"],
            claim=ClaimSource(claim["claimName"], claim.get("subPath"), claim["readOnly"]) if claim else None,
            host_path=HostPathSource(host["path"], host["type"]) if host else None,
            hub=hub,
            cache=_cache(model.get("cache")),
        ),
        replicas=s["replicas"],
        npu=NPUSpec(
            s["npu"].get("resourceName"),
            s["npu"]["count"],
            s["npu"].get("chipName"),
            s["npu"]["nodes"],
            s["npu"].get("family"),
        ),
        parallelism=ParallelismSpec(
            **{k: s["parallelism"][k] for k in ("tensor", "pipeline", "data")}, expert=s["parallelism"]["expert"]
        ),
        graph=GraphSpec(
            mode=graph["mode"],
            capture_sizes=tuple(graph["captureSizes"]) if "captureSizes" in graph else None,
            max_capture_size=graph.get("maxCaptureSize"),
            stream_budget=graph.get("streamBudget"),
            on_downgrade=graph["onDowngrade"],
        ),
        engine=EngineSpec(
            image=engine.get("image"),
            image_pull_policy=engine.get("imagePullPolicy"),
            max_num_seqs=engine["maxNumSeqs"],
            max_model_len=engine.get("maxModelLen"),
            gpu_memory_utilization=float(engine["gpuMemoryUtilization"]),
            dtype=engine["dtype"],
            speculative=(
                SpeculativeSpec(speculative["method"], speculative["numTokens"], speculative.get("model"))
                if speculative
                else None
            ),
            extra_args=tuple(engine.get("extraArgs", ())),
            env=tuple(engine.get("env", ())),
            startup_timeout_seconds=engine["startupTimeoutSeconds"],
            shm_size=engine["shmSize"],
            max_num_batched_tokens=engine.get("maxNumBatchedTokens"),
            quantization=engine.get("quantization"),
            additional_config=engine.get("additionalConfig"),
        ),
        resources=s["resources"],
        template=PodTemplateSpec(
            labels=template.get("metadata", {}).get("labels", {}),
            annotations=template.get("metadata", {}).get("annotations", {}),
            node_selector=template.get("nodeSelector", {}),
            tolerations=tuple(template.get("tolerations", ())),
            affinity=template.get("affinity"),
            scheduler_name=template.get("schedulerName"),
            priority_class_name=template.get("priorityClassName"),
            service_account_name=template.get("serviceAccountName"),
            image_pull_secrets=tuple(secret["name"] for secret in template.get("imagePullSecrets", ())),
        ),
        pod_monitor=PodMonitorSpec(monitor["enabled"], monitor["interval"], monitor.get("labels", {})),
        autoscaling=_autoscaling(s.get("autoscaling")),
        routing=_routing(s.get("routing")),
        disaggregation=_disaggregation(s.get("disaggregation")),
        lora=_lora(s.get("lora")),
        cache_aware_routing=_cache_aware_routing(s.get("cacheAwareRouting")),
    )


def _cache_aware_routing(value: JSON | None) -> CacheAwareRoutingSpec | None:
    if value is None:
        return None
    return CacheAwareRoutingSpec(kv_events=bool(value["kvEvents"]))


def _disaggregation(d: JSON | None) -> DisaggregationSpec | None:
    if d is None:
        return None
    prefill, connector, router = d["prefill"], d["connector"], d["router"]
    parallelism = prefill["parallelism"]
    return DisaggregationSpec(
        prefill=PrefillSpec(
            replicas=prefill["replicas"],
            npu_count=prefill["npu"]["count"],
            nodes=prefill["npu"]["nodes"],
            parallelism=ParallelismSpec(
                **{k: parallelism[k] for k in ("tensor", "pipeline", "data")}, expert=parallelism["expert"]
            ),
            graph_mode=prefill["graphMode"],
            max_num_seqs=prefill["maxNumSeqs"],
            max_num_batched_tokens=prefill.get("maxNumBatchedTokens"),
            gpu_memory_utilization=float(prefill["gpuMemoryUtilization"]),
            additional_config=prefill.get("additionalConfig"),
            extra_args=tuple(prefill.get("extraArgs", ())),
            env=tuple(prefill.get("env", ())),
            min_replicas=prefill["minReplicas"],
            max_replicas=prefill.get("maxReplicas"),
        ),
        connector=ConnectorSpec(connector["name"], connector.get("port"), dict(connector.get("extraConfig", {}))),
        router=RouterSpec(router["replicas"], router["timeoutSeconds"], router["retries"]),
        decode=DecodeSpec(d.get("decode", {}).get("dataParallel", DATA_PARALLEL_INTERNAL)),
    )


def _autoscaling(value: JSON | None) -> AutoscalingSpec | None:
    if value is None:
        return None
    return AutoscalingSpec(
        min_replicas=value["minReplicas"],
        max_replicas=value["maxReplicas"],
        target_utilization=value["targetUtilization"],
        running_requests_per_replica=value.get("runningRequestsPerReplica"),
        queue_depth_per_replica=value.get("queueDepthPerReplica"),
        scale_up_period_seconds=value.get("scaleUpPeriodSeconds"),
        scale_down_stabilization_seconds=value.get("scaleDownStabilizationSeconds"),
        polling_interval_seconds=value["pollingIntervalSeconds"],
        prometheus=_prometheus(value.get("prometheus", {})),
    )


def _prometheus(value: JSON) -> PrometheusSpec:
    ref = value.get("authenticationRef")
    return PrometheusSpec(
        address=value.get("address"),
        authentication=AuthenticationRef(ref["name"], ref["kind"]) if ref else None,
        auth_modes=tuple(value.get("authModes", ())),
        unsafe_ssl=value.get("unsafeSsl", False),
    )


def _routing(value: JSON | None) -> RoutingSpec | None:
    if value is None:
        return None
    gateway = value.get("gateway")
    return RoutingSpec(
        failure_mode=value["failureMode"],
        gateway=_gateway(gateway) if gateway else None,
        request_timeout_seconds=value["requestTimeoutSeconds"],
    )


def _gateway(value: JSON) -> GatewayRef:
    return GatewayRef(
        value["name"], value.get("namespace"), value.get("sectionName"), tuple(value.get("hostnames", ()))
    )


def _lora(value: JSON | None) -> LoraSpec | None:
    if value is None:
        return None
    return LoraSpec(
        max_loras=value["maxLoras"],
        max_lora_rank=value["maxLoraRank"],
        max_cpu_loras=value.get("maxCpuLoras"),
        adapters=tuple(_lora_adapter(adapter) for adapter in value.get("adapters", ())),
    )


def _lora_adapter(adapter: JSON) -> LoraAdapterSpec:
    source = adapter["source"]
    claim, host = source.get("persistentVolumeClaim"), source.get("hostPath")
    return LoraAdapterSpec(
        name=adapter["name"],
        hub=_hub_source(source),
        claim_name=claim["claimName"] if claim else None,
        host_path=host["path"] if host else None,
        sub_path=(claim or host or {}).get("subPath", ""),
    )


def _hub_source(source: JSON) -> HubSource | None:
    for field, hub in HUB_SOURCE_FIELDS.items():
        if (repo := source.get(field)) is not None:
            token = repo.get("tokenSecretRef")
            return HubSource(
                hub=hub,
                repository=repo["repository"],
                revision=repo.get("revision"),
                allow_patterns=tuple(repo.get("allowPatterns", ())),
                ignore_patterns=tuple(repo.get("ignorePatterns", ())),
                token=SecretKey(token["name"], token.get("key", "token")) if token else None,
                endpoint=repo.get("endpoint"),
                send_token_over_http=bool(repo.get("sendTokenOverHTTP", False)),
            )
    return None


def _cache(cache: JSON | None) -> CacheSpec | None:
    if cache is None:
        return None
    create = cache.get("create")
    return CacheSpec(
        claim_name=cache["claimName"],
        create=(
            CacheClaimTemplate(
                create.get("storageClassName"), create["size"], create.get("accessMode", "ReadWriteMany")
            )
            if create
            else None
        ),
    )


def plan_options(spec: NPUInferenceSpec) -> PlanOptions:
    """The runtime planner's options for `spec` (what `npu-runtime plan` and `serve` are given)."""
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
        flashcomm1=_flashcomm1(spec.engine),
        max_loras=spec.lora.max_loras if spec.lora else None,
        max_lora_rank=spec.lora.max_lora_rank if spec.lora else None,
        max_cpu_loras=spec.lora.max_cpu_loras if spec.lora else None,
    )


def _flashcomm1(engine: EngineSpec) -> bool | None:
    """vllm-ascend's flashcomm1 as the engine will read it (vllm_ascend/ascend_config.py: the
    additional config's enable_flashcomm1, else VLLM_ASCEND_ENABLE_FLASHCOMM1); None: not set."""
    config = engine.additional_config
    if isinstance(config, Mapping) and "enable_flashcomm1" in config:
        return bool(config["enable_flashcomm1"])
    for variable in engine.env:
        if variable.get("name") == "VLLM_ASCEND_ENABLE_FLASHCOMM1" and isinstance(variable.get("value"), str):
            return variable["value"].strip() not in ("", "0")
    return None
