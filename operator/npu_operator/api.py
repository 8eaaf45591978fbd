"""The typed view of an NPUInference spec, and the checks the CRD's schema cannot express.

`parse_spec` applies the CRD's own defaults (see `crd`) before reading, so a default lives in
one place: the CRD file. `validate_spec` finds what the schema lets through but the operator
must refuse (for example an extended resource in the kubernetes.io domain, or an extra engine
argument that fights a field); each problem names the field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.contract import parse_size
from npu_runtime.fetch.listing import REVISION_PATTERN

from npu_operator import crd

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


@dataclasses.dataclass(frozen=True)
class DisaggregationSpec:
    """Prefill/decode disaggregation: the spec's workload is the decode role, this adds the rest."""

    prefill: PrefillSpec
    connector: ConnectorSpec
    router: RouterSpec


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
    polling_interval_seconds: int
    prometheus_address: str | None  # None: the operator's setting


@dataclasses.dataclass(frozen=True)
class GatewayRef:
    name: str
    namespace: str | None
    section_name: str | None


@dataclasses.dataclass(frozen=True)
class RoutingSpec:
    """spec.routing: an InferencePool and its endpoint picker (see `routing`)."""

    failure_mode: str  # FailOpen | FailClose
    gateway: GatewayRef | None


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
        npu=NPUSpec(s["npu"].get("resourceName"), s["npu"]["count"], s["npu"].get("chipName"), s["npu"]["nodes"]),
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
    )


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
        ),
        connector=ConnectorSpec(connector["name"], connector.get("port"), dict(connector.get("extraConfig", {}))),
        router=RouterSpec(router["replicas"], router["timeoutSeconds"], router["retries"]),
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
        prometheus_address=value.get("prometheus", {}).get("address"),
    )


def _routing(value: JSON | None) -> RoutingSpec | None:
    if value is None:
        return None
    gateway = value.get("gateway")
    return RoutingSpec(
        failure_mode=value["failureMode"],
        gateway=GatewayRef(gateway["name"], gateway.get("namespace"), gateway.get("sectionName")) if gateway else None,
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


# --- checks beyond the schema -------------------------------------------------------------------

_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_EXTENDED_RESOURCE = re.compile(rf"^(?P<domain>{_DNS_SUBDOMAIN})/(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")

# vLLM flags that a spec field (or the operator) sets; in engine.extraArgs they would override the
# plan, since the extras come last and argparse keeps the last value. Long and short spellings.
FLAGS_OWNED_BY_FIELDS: Final = {
    "--model": "spec.model.path",
    "--served-model-name": "spec.model.name",
    "--host": "(set by the operator)",
    "--port": "(set by the operator)",
    "--config": "the spec (a --config file would override every engine option)",
    "--max-num-seqs": "spec.engine.maxNumSeqs",
    "--max-model-len": "spec.engine.maxModelLen",
    "--gpu-memory-utilization": "spec.engine.gpuMemoryUtilization",
    "--dtype": "spec.engine.dtype",
    "--tensor-parallel-size": "spec.parallelism.tensor",
    "-tp": "spec.parallelism.tensor",
    "--pipeline-parallel-size": "spec.parallelism.pipeline",
    "-pp": "spec.parallelism.pipeline",
    "--data-parallel-size": "spec.parallelism.data",
    "-dp": "spec.parallelism.data",
    "--compilation-config": "spec.graph",
    "-cc": "spec.graph",
    "--optimization-level": "spec.graph",
    "-O": "spec.graph",
    "--cuda-graph-sizes": "spec.graph.captureSizes",
    "--cudagraph-capture-sizes": "spec.graph.captureSizes",
    "--max-cudagraph-capture-size": "spec.graph.maxCaptureSize",
    "--enforce-eager": "spec.graph.mode (NONE)",
    "--speculative-config": "spec.engine.speculative",
    "--max-num-batched-tokens": "spec.engine.maxNumBatchedTokens",
    "--enable-expert-parallel": "spec.parallelism.expert",
    "-ep": "spec.parallelism.expert",
    "--quantization": "spec.engine.quantization",
    "-q": "spec.engine.quantization",
    "--additional-config": "spec.engine.additionalConfig",
    # Multi-node data parallel: derived from spec.npu.nodes and spec.parallelism.data per pod.
    "--data-parallel-size-local": "spec.npu.nodes",
    "-dpl": "spec.npu.nodes",
    "--data-parallel-start-rank": "spec.npu.nodes",
    "-dpr": "spec.npu.nodes",
    "--data-parallel-address": "spec.npu.nodes",
    "-dpa": "spec.npu.nodes",
    "--data-parallel-rpc-port": "spec.npu.nodes",
    "-dpp": "spec.npu.nodes",
    "--headless": "spec.npu.nodes",
    # A disaggregated resource's roles: the connector's settings, rendered per role.
    "--kv-transfer-config": "spec.disaggregation.connector",
    "--kv-connector-extra-config": "spec.disaggregation.connector.extraConfig",
}


def engine_flag(arg: str) -> str | None:
    """The option `arg` names, spelled as vLLM's FlexibleArgumentParser reads it; None for a value.

    That parser turns underscores into dashes in a long option's name (up to the first `.`),
    reads `--name.key value` as a JSON field of `--name`, reads `-O3`, `-O=3` and `-Odecode` as
    `--optimization-level`, and, being an argparse parser, accepts `--name=value` and `-xy=value`.
    """
    if arg.startswith("--") and len(arg) > 2:
        name = arg[2:].split("=", 1)[0].split(".", 1)[0]
        return "--" + name.replace("_", "-")
    if arg.startswith("-O"):
        return "-O"
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit() and arg[1] != ".":
        return arg.split("=", 1)[0].split(".", 1)[0]
    return None


def owned_flag(arg: str) -> str | None:
    """The owned flag `arg` sets, in any spelling vLLM accepts, abbreviations included.

    argparse (allow_abbrev, on in vLLM) takes a unique prefix of an option for the option, and
    refuses an ambiguous one: so a prefix of an owned flag is refused too (it is the owned flag,
    or it would fail anyway).
    """
    flag = engine_flag(arg)
    if flag is None or flag in ("-", "--"):
        return None
    if flag == "-O":
        return flag
    if (found := next((owned for owned in FLAGS_OWNED_BY_FIELDS if owned.startswith(flag)), None)) is not None:
        return found
    # A one-letter option with its value attached: argparse reads `-qawq` as `-q awq` when no
    # option starts with `-qawq` (CPython 3.11, Lib/argparse.py, _get_option_tuples).
    if not flag.startswith("--") and len(flag) > 2 and flag[:2] in FLAGS_OWNED_BY_FIELDS:
        return flag[:2]
    return None


# Variables the NPU device plugin sets per pod; overriding them breaks device isolation.
ENV_OWNED_BY_DEVICE_PLUGIN: Final = ("ASCEND_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


def extended_resource_problem(name: str) -> str | None:
    """Why `name` cannot be an extended resource name, or None when it can."""
    match = _EXTENDED_RESOURCE.match(name)
    if not match or len(name) > 253 or len(match["name"]) > 63:
        return f"{name!r} is not an extended resource name such as huawei.com/Ascend910 (domain/name)"
    domain = match["domain"]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"{name!r} is in the kubernetes.io domain, which is reserved for native resources"
    if match["name"].startswith("requests."):
        return f"{name!r}: the 'requests.' prefix is reserved for quota"
    return None


def validate_spec(spec: NPUInferenceSpec) -> list[SpecError]:
    """What the schema and its CEL rules let through but cannot be served, each naming its field."""
    problems: list[SpecError] = []
    if spec.npu.resource_name is not None and (why := extended_resource_problem(spec.npu.resource_name)):
        problems.append(SpecError("spec.npu.resourceName", why))
    if spec.model.name.startswith("-"):
        why = f"{spec.model.name!r} would be read as a flag; start it otherwise"
        problems.append(SpecError("spec.model.name", why))
    engine = spec.engine
    problems += _engine_problems("spec.engine", engine.extra_args, engine.env, engine.additional_config)
    if spec.disaggregation is not None:
        problems += _disaggregation_problems(spec)
    if spec.model.hub is not None and spec.model.cache is None:
        problems.append(SpecError("spec.model.cache", "a huggingFace or modelScope source needs a cache volume"))
    if not _absolute_clean(spec.model.path):
        problems.append(SpecError("spec.model.path", f"{spec.model.path!r} must be an absolute path without '..'"))
    speculative_model = spec.engine.speculative.model if spec.engine.speculative else None
    if speculative_model and not _absolute_clean(speculative_model):
        problems.append(SpecError("spec.engine.speculative.model", "must be an absolute path in the pod without '..'"))
    try:
        parse_size(spec.engine.shm_size)
    except ValueError as exc:
        problems.append(SpecError("spec.engine.shmSize", str(exc)))
    problems += _hub_problems(spec.model.hub)
    return problems


# vllm-ascend's additional config is small (a few options); one argument of the engine's command line.
ADDITIONAL_CONFIG_MAX_BYTES: Final = 16384


def _hub_problems(hub: HubSource | None) -> list[SpecError]:
    if hub is None:
        return []
    field = "spec.model.source." + next(name for name, value in HUB_SOURCE_FIELDS.items() if value == hub.hub)
    problems: list[SpecError] = []
    # The CRD has the same pattern; checked here too, for objects stored before it had one.
    if hub.revision is not None and not re.match(REVISION_PATTERN, hub.revision):
        problems.append(SpecError(f"{field}.revision", f"{hub.revision!r} is not a branch, tag or commit name"))
    plain = hub.endpoint is not None and not hub.endpoint.startswith("https://")
    if hub.token is not None and plain and not hub.send_token_over_http:
        why = (
            f"{hub.endpoint!r} is not https://: the token in tokenSecretRef would travel in clear text;"
            " use https, or set sendTokenOverHTTP: true to accept that"
        )
        problems.append(SpecError(f"{field}.endpoint", why))
    return problems


def _engine_problems(
    prefix: str, extra_args: Sequence[str], env: Sequence[JSON], additional_config: JSON | None
) -> list[SpecError]:
    """One engine's extra arguments, env and additional config under `prefix` (spec.engine, a P/D role)."""
    problems: list[SpecError] = []
    for index, arg in enumerate(extra_args):
        if (flag := owned_flag(arg)) is not None:
            spelled = "" if arg.split("=", 1)[0] == flag else f"{arg.split('=', 1)[0]!r} is {flag}: "
            why = f"{spelled}{flag} is set from {FLAGS_OWNED_BY_FIELDS[flag]}; set it there instead"
            problems.append(SpecError(f"{prefix}.extraArgs[{index}]", why))
    for index, var in enumerate(env):
        if var["name"] in ENV_OWNED_BY_DEVICE_PLUGIN:
            why = f"{var['name']} is set by the NPU device plugin for the NPUs it allocates"
            problems.append(SpecError(f"{prefix}.env[{index}]", why))
    if additional_config is not None:
        size = len(json.dumps(additional_config, separators=(",", ":")))
        if size > ADDITIONAL_CONFIG_MAX_BYTES:
            why = f"is {size} bytes as JSON, more than {ADDITIONAL_CONFIG_MAX_BYTES} (it is one command-line argument)"
            problems.append(SpecError(f"{prefix}.additionalConfig", why))
    return problems


def _disaggregation_problems(spec: NPUInferenceSpec) -> list[SpecError]:
    """The prefill role's extra arguments and env, and the connector's port (vllm-ascend's rules)."""
    from npu_operator import disaggregation  # the one place that renders the connector's settings

    assert spec.disaggregation is not None
    prefill = spec.disaggregation.prefill
    problems = _engine_problems(
        "spec.disaggregation.prefill", prefill.extra_args, prefill.env, prefill.additional_config
    )
    for setting, why in disaggregation.connector_problems(spec):
        problems.append(SpecError(f"spec.disaggregation.connector.{setting}", why))
    # The ScaledObject and the InferencePool select the engines' pods of one workload; with two roles
    # behind a router neither is built yet.
    for field, value in (("spec.autoscaling", spec.autoscaling), ("spec.routing", spec.routing)):
        if value is not None:
            why = "is not supported with spec.disaggregation yet (the router is the resource's endpoint)"
            problems.append(SpecError(field, why))
    return problems


def _absolute_clean(path: str) -> bool:
    return path.startswith("/") and ".." not in path.split("/")


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The condition of this type in `obj`'s status (any Kubernetes object), or an empty mapping."""
    found: Mapping[str, Any] = next(
        (c for c in obj.get("status", {}).get("conditions", []) if c.get("type") == kind), {}
    )
    return found


def is_true(obj: Mapping[str, Any], kind: str) -> bool:
    return condition(obj, kind).get("status") == "True"
