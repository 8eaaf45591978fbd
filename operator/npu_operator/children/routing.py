"""spec.routing: an InferencePool of the serving pods, its endpoint picker, and optionally an HTTPRoute.

The pool is the Gateway API Inference Extension's `InferencePool` (inference.networking.k8s.io/v1,
kubernetes-sigs/gateway-api-inference-extension v1.6.0, config/crd/bases/
inference.networking.k8s.io_inferencepools.yaml): `selector.matchLabels` picks the pods that serve
the API (the leaders of multi-node replicas: a worker runs headless DP ranks and has no API),
`targetPorts` their OpenAI port, and `endpointPickerRef` (optional in the schema, always set here)
the picker's Service and gRPC port.

The picker is llm-d's router endpoint picker (llm-d/llm-d-router v0.9.0, which the inference
extension's README points to for "EPP and associated APIs"). One per resource, because a picker
serves exactly one pool (`--pool-name`); it is named `<resource>-epp` and owned by the resource, so
it comes and goes with it. Its objects follow llm-d's own chart (config/charts/routerlib/templates:
_deployment.yaml for the flags, ports and gRPC probes, _rbac.yaml and llm-d-router-gateway's
rbac.yaml for the read-only Role, _config.yaml for the EndpointPickerConfig), with less: no
ClusterRole (its metrics endpoint runs without authentication, --metrics-endpoint-auth=false, as
that chart renders it when auth is off), no leader election (one replica, Recreate).

Its configuration keeps every pod within what it decodes in a captured graph: the
`concurrency-detector` (pkg/epp/framework/plugins/flowcontrol/saturationdetector/concurrency) both
filters out an endpoint with maxConcurrency x (1 + headroom) requests in flight and, as the
saturation detector of flow control (feature gate "flowControl"), holds requests in the picker
once the pool is full. maxConcurrency is the plan's largest captured decode batch x the DP ranks
behind the pod, headroom 0; the in-flight counts come from `inflight-load-producer`, which the
detector consumes. Scoring is llm-d's default (queue, KV-cache use, prefix cache), and with LoRA
adapters its `lora-affinity-scorer` (`picker_config`).

What a real cluster needs besides (each function below cites its upstream source):
- the picker's own metrics scraped (`build_picker_pod_monitor`): its flow control's held requests are
  what wakes a resource scaled to zero (`scaling.picker_queue_query`);
- TLS between the gateway and the picker (`picker_args`, `build_destination_rule`): the picker serves
  its gRPC port with a self-signed certificate, which kgateway and Envoy AI Gateway dial with TLS
  and no verification, and Istio only with a DestinationRule;
- a request timeout on the route that covers a long completion and, with scale to zero, a cold
  start (`route_timeouts`);
- queue and KV-cache figures over every DP rank behind one API server (`picker_config`).

With spec.disaggregation the pool's endpoints are the P/D router's pods (`npu-runtime route`), not the
engines: the router pairs a prefill engine with a decode engine and moves vllm-ascend's Mooncake
parameters between them, which llm-d's own P/D scheduling cannot do for vllm-ascend (its v0.9.0
sidecar's `--kv-connector=mooncake` speaks vLLM's MooncakeConnector protocol, a bootstrap server's
`/query` and a `transfer_id` with prefill and decode sent at once, pkg/sidecar/proxy/
connector_mooncake.go handleMooncake; vllm-ascend's MooncakeConnectorV1 hands its KV's location
back in the prefill answer, which decode must be given). The picker then balances requests over
the router replicas by its own count of requests in flight (`router_picker_config`): a router pod
serves no vLLM metrics on the pool's port, and its engines' load is its own to weigh.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Final

import yaml
from npu_runtime.contract import DEFAULT_PORT as HTTP_PORT
from npu_runtime.contract import KV_EVENTS_BLOCK_SIZE, KV_EVENTS_HASH_SEED, KV_EVENTS_PORT
from npu_runtime.metrics import ENGINE_KV_CACHE_USAGE, ENGINE_REQUESTS_RUNNING, ENGINE_REQUESTS_WAITING
from npu_runtime.routing.options import DEFAULT_MAX_IN_FLIGHT

from npu_operator.api import crd
from npu_operator.api.spec import GatewayRef, NPUInferenceSpec
from npu_operator.children.kinds import (
    DESTINATION_RULES,
    HTTP_ROUTE,
    INFERENCE_POOL,
    PICKER_DEPLOYMENT,
    PICKER_POD_MONITOR,
)

JSON = dict[str, Any]

POOL_API_VERSION: Final = "inference.networking.k8s.io/v1"
POOL_GROUP: Final = "inference.networking.k8s.io"
GATEWAY_GROUP: Final = "gateway.networking.k8s.io"
# The picker's ports (llm-d-router's chart: grpc 9002 for the gateway's ext-proc calls, grpc-health
# 9003, metrics 9090).
PICKER_GRPC_PORT: Final = 9002
PICKER_HEALTH_PORT: Final = 9003
PICKER_METRICS_PORT: Final = 9090
PICKER_CONFIG_FILE: Final = "config.yaml"
PICKER_CONFIG_DIR: Final = "/config"
PICKER_CONTAINER: Final = "epp"
PICKER_APP: Final = "npu-inference-picker"
PICKER_LABEL: Final = f"{crd.GROUP}/picker"
# The picker's own config API (llm-d/llm-d-router apix/config/v1alpha1 EndpointPickerConfig).
PICKER_CONFIG_API: Final = "llm-d.ai/v1alpha1"
# Conservatively, as long as the serving pods' own grace period (llm-d's chart: "this timeout should
# mirror the longest grace period of the pods within the pool").
PICKER_GRACE_SECONDS: Final = 130
DETECTOR: Final = "concurrency-detector"
EXTRACTOR: Final = "core-metrics-extractor"
# The series the picker reads from each serving pod's /metrics (port 8000, the pool's target port:
# llm-d-router v0.9.0 pkg/epp/datastore/datastore.go podUpdateOrAddIfNotExist scrapes the target port
# when --model-server-metrics-port is unset). vLLM writes one series per engine (DP rank, label
# `engine`), and the extractor keeps one series per metric: the matching series with the latest
# timestamp, the first when the exposition has none, as vLLM's has not
# (pkg/epp/framework/plugins/datalayer/extractor/metrics/spec.go Spec.getLatestMetric); it has no
# aggregation. With more than one DP rank behind a pod the picker therefore reads these, which the
# runtime adds to the API server's /metrics with no `engine` label: the sum over the ranks of
# vllm:num_requests_waiting and vllm:num_requests_running, and the mean of vllm:kv_cache_usage_perc
# (the fraction of all the pod's KV blocks in use, the ranks being the same size).
# The names are the runtime's (npu_runtime.metrics.ENGINE_LOAD_METRICS; its graph observer serves them).
DP_WAITING_METRIC: Final = ENGINE_REQUESTS_WAITING.name
DP_RUNNING_METRIC: Final = ENGINE_REQUESTS_RUNNING.name
DP_KV_USAGE_METRIC: Final = ENGINE_KV_CACHE_USAGE.name
# The extractor's engine config for them (factories.go engineConfigParams); the block size and LoRA
# info stay vLLM's own (the same on every rank).
DP_ENGINE: Final = "npu-runtime-dp"
# With LoRA adapters (llm-d-router v0.9.0 pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/
# lora_affinity.go: LoraAffinityScorerType, LoraAffinityScorerFactory, which takes no parameters,
# registered in cmd/epp/runner/runner.go): each pod scored for the request's model (the body's
# `model`, pkg/epp/requestcontrol/director.go TargetModelName) as 1.0 when the adapter is running
# there, 0.8 when the pod has a free adapter slot, 0.6 when the adapter is waiting there, else 0. It
# reads what the core metrics extractor takes from vLLM's `vllm:lora_requests_info` gauge (labels
# `running_lora_adapters`, `waiting_lora_adapters`, `max_lora`; vllm/v1/metrics/loggers.py, only with
# --enable-lora): datalayer/extractor/metrics/extractor.go populateLoRAMetrics into ActiveModels,
# WaitingModels and MaxActiveModels. That spec is the extractor's default for vLLM (factories.go
# defaultEngineConfigs "vllm": loraSpec "vllm:lora_requests_info", and `dp_extractor_parameters`
# keeps it), so nothing more is configured; its series are told apart by their value, the time each
# was set (loraspec.go LoRASpec.getLatestMetric), so with several DP ranks the latest rank's counts.
LORA_SCORER: Final = "lora-affinity-scorer"
# Below the load scorers (2 + 2) and the prefix cache (3): the scores differ by at most 1.0, so the
# adapter breaks ties between pods equally loaded (a running adapter saves a GPU slot swap, which costs
# less than a queue) and never sends a request to a busier pod for it. 1 is the plugin README's own.
LORA_WEIGHT: Final = 1
# spec.cacheAwareRouting.kvEvents: llm-d-router v0.9.0's precise prefix cache pipeline in place of the
# approximate producer behind `prefix-cache-scorer` (`precise_prefix_plugins`). The all-in-one
# `precise-prefix-cache-scorer` is deprecated there (pkg/epp/framework/plugins/scheduling/scorer/
# preciseprefixcache/precise_prefix_cache.go PluginFactory: "configure precise-prefix-cache-producer +
# prefix-cache-scorer with prefixMatchInfoProducerName"), so the split form of its own sample
# (deploy/config/epp-precise-prefix-cache-config.yaml) is configured.
TOKEN_PRODUCER: Final = "token-producer"
NOTIFICATION_SOURCE: Final = "endpoint-notification-source"
PRECISE_PRODUCER: Final = "precise-prefix-cache-producer"
PREFIX_SCORER: Final = "prefix-cache-scorer"
METRICS_SOURCE: Final = "metrics-data-source"
# llm-d-kv-cache pkg/kvevents/pool.go DefaultConfig: the subscription filter of llm-d's topics ("kv@...").
KV_TOPIC_FILTER: Final = "kv@"


@dataclasses.dataclass(frozen=True)
class Pool:
    """What the routing objects of one resource are made from."""

    name: str
    namespace: str
    labels: Mapping[str, str]  # the resource's labels, for the objects themselves
    pods: Mapping[str, str]  # the labels of the serving pods
    max_concurrency: int  # requests per serving pod: largest captured batch x its DP ranks
    failure_mode: str
    data_parallel: int = 1  # DP ranks behind each serving pod's API server
    behind_router: bool = False  # the pods are a P/D resource's routers (`router_picker_config`)
    # The pods serve LoRA adapters (spec.lora): the picker also scores each pod by the adapter the
    # request names (`picker_config`, LORA_SCORER). Not used behind a router (`router_picker_config`).
    lora: bool = False
    # The engines publish their KV events (spec.cacheAwareRouting.kvEvents): the precise prefix cache
    # scorer, which tokenizes each prompt with `model` at `tokenizer_url` (`precise_prefix_plugins`).
    kv_events: bool = False
    model: str = ""
    tokenizer_url: str = ""

    @property
    def precise_prefix(self) -> bool:
        """Whether the picker follows the engines' KV events (`precise_prefix_plugins` says when it can)."""
        return self.kv_events and not self.behind_router and self.data_parallel == 1

    @property
    def picker(self) -> str:
        return PICKER_DEPLOYMENT.child_name(self.name)


def endpoint_concurrency(spec: NPUInferenceSpec, per_replica: int) -> int:
    """Requests one endpoint of the pool takes at once: an engine pod's largest captured batch x its DP
    ranks (`per_replica`, `scaling.Capacity`); a P/D router's --max-in-flight (the operator keeps the
    router's default), above which it answers 503 itself."""
    return DEFAULT_MAX_IN_FLIGHT if spec.disaggregation is not None else per_replica


def build_inference_pool(pool: Pool) -> JSON:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": INFERENCE_POOL.kind,
        "metadata": _metadata(pool, pool.name),
        "spec": {
            "selector": {"matchLabels": dict(pool.pods)},
            "targetPorts": [{"number": HTTP_PORT}],
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": pool.picker,
                "port": {"number": PICKER_GRPC_PORT},
                "failureMode": pool.failure_mode,
            },
        },
    }


def precise_prefix_plugins(model: str, tokenizer_url: str) -> tuple[list[JSON], JSON]:
    """The plugins of llm-d-router v0.9.0's precise prefix cache scoring, and the data layer that feeds
    them: what `prefix-cache-scorer` scores then comes from the engines' own KV events.

    - `token-producer` (pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/tokenizer.go
      PluginFactory, tokenizerPluginConfig: modelName, vllm.url): the prompt's tokens as the engine
      makes them, from vLLM's /v1/completions/render and /v1/chat/completions/render at `tokenizer_url`
      (the resource's own Service: its engines serve them, `npu_runtime.kv_events`). Its default backend,
      `estimate`, packs bytes instead, and its README warns that the precise producer "silently degrades"
      on it; the deprecated tokenizer sidecar (udsTokenizerConfig) is not needed.
    - `precise-prefix-cache-producer` (dataproducer/preciseprefixcache/producer.go PluginFactory,
      PluginConfig: tokenProcessorConfig, indexerConfig, kvEventsConfig; its defaults are overlaid, so
      only what differs is written): blocks of KV_EVENTS_BLOCK_SIZE tokens, hashed from
      KV_EVENTS_HASH_SEED (llm-d-kv-cache pkg/kvcache/kvblock/token_processor.go TokenProcessorConfig
      blockSize, hashSeed: "aligned with vLLM's PYTHONHASHSEED"; `blockSize` as v0.9.0's own
      test/e2e/configs_test.go writes it); events from each endpoint of the pool (kvEventsConfig
      discoverPods, podDiscoveryConfig.socketPort: extractor.go ensureSubscriber dials the endpoint's
      address at socketPort + its rank index) under llm-d's topic filter (topicFilter).
    - `endpoint-notification-source` (datalayer/source/notifications endpoint_datasource.go): the pool's
      endpoints as they come and go, extracted by the producer (its per-pod subscribers); the metrics
      source keeps its extractor (the loader injects only when no metrics source is listed:
      pkg/epp/config/loader/defaults.go ensureDataLayer).
    - `prefix-cache-scorer` bound to the producer by prefixMatchInfoProducerName
      (scheduling/scorer/prefix/plugin.go; without it the scorer spawns the approximate producer).
    """
    plugins: list[JSON] = [
        {"type": TOKEN_PRODUCER, "parameters": {"modelName": model, "vllm": {"url": tokenizer_url}}},
        {"type": NOTIFICATION_SOURCE},
        {
            "type": PRECISE_PRODUCER,
            "parameters": {
                "tokenProcessorConfig": {"blockSize": KV_EVENTS_BLOCK_SIZE, "hashSeed": KV_EVENTS_HASH_SEED},
                "kvEventsConfig": {
                    "topicFilter": KV_TOPIC_FILTER,
                    "discoverPods": True,
                    "podDiscoveryConfig": {"socketPort": KV_EVENTS_PORT},
                },
            },
        },
        {"type": PREFIX_SCORER, "parameters": {"prefixMatchInfoProducerName": PRECISE_PRODUCER}},
    ]
    data_layer: JSON = {
        "sources": [
            {"pluginRef": METRICS_SOURCE, "extractors": [{"pluginRef": EXTRACTOR}]},
            {"pluginRef": NOTIFICATION_SOURCE, "extractors": [{"pluginRef": PRECISE_PRODUCER}]},
        ]
    }
    return plugins, data_layer


def picker_config(
    max_concurrency: int,
    data_parallel: int = 1,
    lora: bool = False,
    precise: tuple[str, str] | None = None,
) -> JSON:
    """The picker's EndpointPickerConfig: no pod above `max_concurrency` requests in flight, each
    pod's load read over all its `data_parallel` ranks; with `lora`, the LoRA affinity scorer too
    (LORA_SCORER, weight LORA_WEIGHT); with `precise` (the model and its tokenizer's URL), the prefix
    cache scored from the engines' KV events (`precise_prefix_plugins`), else from the picker's own
    record of the prompts it routed (the approximate producer, the scorer's default).

    Precise only with one DP rank behind each pod's API server (`Pool.precise_prefix`): the producer
    subscribes to one socket per endpoint (socketPort + the endpoint's rank index, which is 0 for a pool
    of one target port), and an API server over several ranks has one per rank, so it would follow
    rank 0's cache alone and score the pod's other ranks' prefixes as misses.

    The saturation detector is named under `flowControl` (llm-d-router v0.9.0
    apix/config/v1alpha1/endpointpickerconfig_types.go FlowControlConfig.SaturationDetector): the
    top-level `saturationDetector` is deprecated there ("use flowControl.saturationDetector instead.
    If both are set, the new field is used"), and pkg/epp/config/loader/configloader.go LoadRawConfig
    logs a DEPRECATION line and copies it over when it finds one.
    """
    extractor: JSON = {"type": EXTRACTOR}
    if data_parallel > 1:
        extractor["parameters"] = dp_extractor_parameters()
    prefix: list[JSON] = [{"type": PREFIX_SCORER}]
    data_layer: JSON | None = None
    if precise is not None:
        prefix, data_layer = precise_prefix_plugins(*precise)
    plugins: list[JSON] = [
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        *prefix,
        *([{"type": LORA_SCORER}] if lora else []),
        {"type": METRICS_SOURCE, "parameters": {"scheme": "http", "path": "/metrics"}},
        extractor,
    ]
    scorers = {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, PREFIX_SCORER: 3}
    if lora:
        scorers[LORA_SCORER] = LORA_WEIGHT
    config = _picker_config(max_concurrency, plugins, scorers)
    if data_layer is not None:
        config["dataLayer"] = data_layer
    return config


def _picker_config(max_concurrency: int, plugins: list[JSON], scorers: dict[str, int]) -> JSON:
    """An EndpointPickerConfig with flow control: the in-flight counts, a saturation detector that
    holds every endpoint to `max_concurrency` requests, then `plugins`; one "default" profile of
    the detector and `scorers` (plugin -> weight)."""
    return {
        "apiVersion": PICKER_CONFIG_API,
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [
            {"type": "inflight-load-producer"},
            {
                "type": DETECTOR,
                "parameters": {"concurrencyMode": "requests", "maxConcurrency": max_concurrency, "headroom": 0},
            },
            *plugins,
        ],
        "flowControl": {"saturationDetector": {"pluginRef": DETECTOR}},
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": DETECTOR},
                    *({"pluginRef": name, "weight": weight} for name, weight in scorers.items()),
                ],
            }
        ],
    }


ACTIVE_REQUEST_SCORER: Final = "active-request-scorer"


def router_picker_config(max_concurrency: int) -> JSON:
    """The picker's EndpointPickerConfig for a pool of P/D routers: no router above `max_concurrency`
    requests in flight (its --max-in-flight, above which it answers 503), and the one with the fewest
    requests in flight first (llm-d-router v0.9.0 pkg/epp/framework/plugins/scheduling/scorer/
    activerequest: the inflight-load-producer's counts). No metrics data source: a router serves
    no vLLM metrics on the pool's port; which engine gets the request is the router's choice.

    No LoRA affinity scorer either, with adapters: a router holds none and exports no
    `vllm:lora_requests_info`, so the scorer would give every router 0 (no adapter active, no slot:
    MaxActiveModels 0), a constant; each router itself sends an adapter's request only to engines
    that hold it (npu_runtime.routing.lora)."""
    return _picker_config(max_concurrency, [{"type": ACTIVE_REQUEST_SCORER}], {ACTIVE_REQUEST_SCORER: 1})


def dp_extractor_parameters() -> JSON:
    """The core metrics extractor's parameters for pods with several DP ranks behind one API server:
    an engine config of the ranks' sums, the default for every pod of the pool (ours carry no
    llm-d.ai/engine-type label). llm-d-router v0.9.0
    pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go: modelServerExtractorParams
    (engineLabelKey, defaultEngine, engineConfigs), engineConfigParams, newCoreMetricsExtractorPlugin
    (a configured engine keeps its name, the built-in ones are appended, defaultEngine must name one)."""
    return {
        "defaultEngine": DP_ENGINE,
        "engineConfigs": [
            {
                "name": DP_ENGINE,
                "queuedRequestsSpec": DP_WAITING_METRIC,
                "runningRequestsSpec": DP_RUNNING_METRIC,
                "kvUsageSpec": DP_KV_USAGE_METRIC,
                "loraSpec": "vllm:lora_requests_info",
                "cacheInfoSpec": "vllm:cache_config_info",
            }
        ],
    }


def picker_args(pool: Pool) -> list[str]:
    """The picker's flags (llm-d-router v0.9.0 pkg/epp/server/options.go AddFlags), its ports written
    out so that the Service, the probes and the PodMonitor follow them. `--secure-serving` is true,
    as its default: the gRPC port serves TLS with a self-signed certificate, which is what kgateway
    and Envoy AI Gateway expect (both dial the picker with TLS and no certificate check; Envoy AI
    Gateway v1.1.0 internal/extensionserver/inferencepool.go
    buildExtProcClusterForInferencePoolEndpointPicker; kgateway-dev/kgateway#11429: a plaintext
    picker fails there) and what Istio does with `build_destination_rule`. The metrics port serves
    plain HTTP /metrics (cmd/epp/runner/runner.go: controller-runtime's metrics server, no
    SecureServing), without authentication here."""
    return [
        "--pool-name",
        pool.name,
        "--pool-namespace",
        pool.namespace,
        "--pool-group",
        POOL_GROUP,
        "--config-file",
        f"{PICKER_CONFIG_DIR}/{PICKER_CONFIG_FILE}",
        "--grpc-port",
        str(PICKER_GRPC_PORT),
        "--grpc-health-port",
        str(PICKER_HEALTH_PORT),
        "--metrics-port",
        str(PICKER_METRICS_PORT),
        "--secure-serving=true",
        "--zap-encoder",
        "json",
        "--tracing=false",
        "--metrics-endpoint-auth=false",
    ]


def build_picker(pool: Pool, image: str) -> list[JSON]:
    """The picker's ServiceAccount, Role, RoleBinding, ConfigMap, Deployment and Service, in apply order."""
    name = pool.picker
    account: JSON = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(pool, name)}
    config: JSON = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(pool, name),
        "data": {PICKER_CONFIG_FILE: yaml.safe_dump(_config_of(pool), sort_keys=False)},
    }
    return [
        account,
        *_picker_rbac(pool),
        config,
        _picker_deployment(pool, image),
        _picker_service(pool),
    ]


def _config_of(pool: Pool) -> JSON:
    if pool.behind_router:
        return router_picker_config(pool.max_concurrency)
    precise = (pool.model, pool.tokenizer_url) if pool.precise_prefix else None
    return picker_config(pool.max_concurrency, pool.data_parallel, pool.lora, precise)


def _picker_selector(pool: Pool) -> dict[str, str]:
    return {"app.kubernetes.io/name": PICKER_APP, PICKER_LABEL: pool.name}


def _picker_rbac(pool: Pool) -> list[JSON]:
    """The picker's Role and RoleBinding: read-only, in the resource's namespace."""
    name = pool.picker
    role: JSON = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(pool, name),
        # Read-only, in the resource's namespace: the pods it routes to, its pool, and the objectives and
        # model rewrites llm-d's picker watches (llm-d-router-gateway's rbac.yaml and routerlib's _rbac.yaml).
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": ["inference.networking.x-k8s.io", "llm-d.ai"],
                "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    }
    binding: JSON = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(pool, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.namespace}],
    }
    return [role, binding]


def _picker_container(pool: Pool, image: str) -> JSON:
    grpc_probe: JSON = {"grpc": {"port": PICKER_HEALTH_PORT, "service": "inference-extension"}}
    return {
        "name": PICKER_CONTAINER,
        "image": image,
        "args": picker_args(pool),
        "ports": [
            {"name": "grpc", "containerPort": PICKER_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": PICKER_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": PICKER_METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "livenessProbe": {**copy.deepcopy(grpc_probe), "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**copy.deepcopy(grpc_probe), "periodSeconds": 2},
        "volumeMounts": [{"name": "config", "mountPath": PICKER_CONFIG_DIR, "readOnly": True}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "privileged": False,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _picker_deployment(pool: Pool, image: str) -> JSON:
    name = pool.picker
    selector = _picker_selector(pool)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pool, name),
        "spec": {
            # One active picker: its prefix-cache and in-flight state is per process (llm-d's chart:
            # Recreate, so the new replica takes over at once).
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(selector)},
            "template": {
                "metadata": {"labels": {**selector, "app.kubernetes.io/instance": pool.name}},
                "spec": {
                    "serviceAccountName": name,
                    "terminationGracePeriodSeconds": PICKER_GRACE_SECONDS,
                    "enableServiceLinks": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [_picker_container(pool, image)],
                    "volumes": [{"name": "config", "configMap": {"name": name}}],
                },
            },
        },
    }


def _picker_service(pool: Pool) -> JSON:
    """The picker's Service, as llm-d-router v0.9.0's chart renders it
    (config/charts/routerlib/templates/_service.yaml): no appProtocol. The gRPC port speaks TLS, so
    `http2` (which Istio reads as cleartext HTTP/2) or `kubernetes.io/h2c` would be false; the port
    name `grpc` tells Istio the protocol inside, and its DestinationRule the TLS around it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool, pool.picker),
        "spec": {
            "type": "ClusterIP",
            "selector": _picker_selector(pool),
            "ports": [
                {"name": "grpc", "port": PICKER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": PICKER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_picker_pod_monitor(pool: Pool, interval: str, labels: Mapping[str, str]) -> JSON:
    """A PodMonitor (monitoring.coreos.com/v1) of the picker's pods, on the one port that serves
    /metrics (`metrics`, --metrics-port; `grpc` and `grpc-health` serve gRPC only).

    prometheus-operator (v0.93.0 pkg/prometheus/promcfg.go generatePodMonitorConfig) keeps the
    targets on the container port of that name and gives every series `namespace`, `pod`,
    `container` and `job`; the picker's own labels on its flow-control gauge include
    `inference_pool` = --pool-name (llm-d-router v0.9.0 pkg/epp/metrics/llm_d_router_metrics.go
    llmdFlowControlQueueSize, set by pkg/epp/flowcontrol/controller/controller.go EnqueueAndWait):
    the two labels `scaling.picker_queue_query` selects on. `labels` are spec.metrics.podMonitor's,
    to match the Prometheus' podMonitorSelector."""
    return {
        "apiVersion": f"{PICKER_POD_MONITOR.resource.group}/{PICKER_POD_MONITOR.resource.version}",
        "kind": PICKER_POD_MONITOR.kind,
        "metadata": {
            "name": pool.picker,
            "namespace": pool.namespace,
            "labels": dict(sorted({**labels, **pool.labels}.items())),
        },
        "spec": {
            "selector": {"matchLabels": _picker_selector(pool)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": interval}],
        },
    }


def build_destination_rule(pool: Pool) -> JSON:
    """Istio's DestinationRule for the picker's Service: TLS to its gRPC port without verifying the
    self-signed certificate, as llm-d-router v0.9.0's chart renders for Istio
    (config/charts/llm-d-router-gateway/templates/istio.yaml: tls mode SIMPLE, insecureSkipVerify),
    on that port only (istio/api v1.30.3 networking/v1alpha3/destination_rule.proto
    TrafficPolicy.port_level_settings, ClientTLSSettings). The short host is the picker's Service in
    the rule's own namespace, whatever the cluster's domain (the proto's note on `host`); it is
    exported to every namespace (no exportTo), so the gateway's proxies, wherever they run, find it."""
    return {
        "apiVersion": DESTINATION_RULES.api_version,
        "kind": DESTINATION_RULES.kind,
        "metadata": _metadata(pool, pool.picker),
        "spec": {
            "host": pool.picker,
            "trafficPolicy": {
                "portLevelSettings": [
                    {
                        "port": {"number": PICKER_GRPC_PORT},
                        "tls": {"mode": "SIMPLE", "insecureSkipVerify": True},
                    }
                ]
            },
        },
    }


def gateway_duration(seconds: int) -> str:
    """`seconds` as a Gateway API Duration (GEP-2257; kubernetes-sigs/gateway-api v1.4.0
    apis/v1/shared_types.go Duration: ^([0-9]{1,5}(h|m|s|ms)){1,4}$), e.g. 2430 -> "40m30s"."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"


def route_timeouts(request_timeout: int, cold_start: int) -> JSON:
    """The route rule's timeouts (Gateway API v1 HTTPRouteRule.timeouts, apis/v1/httproute_types.go
    HTTPRouteTimeouts, v1.4.0).

    `backendRequest` bounds one request to a serving pod: one completion, `request_timeout`.
    `request` bounds the whole exchange: that plus `cold_start`, the time the picker may hold a
    request before a pod can take it (with scale to zero: KEDA's polling interval and a replica's
    startup timeout; otherwise 0). The schema's rule "backendRequest timeout cannot be longer than
    request timeout" holds by construction."""
    return {
        "request": gateway_duration(request_timeout + cold_start),
        "backendRequest": gateway_duration(request_timeout),
    }


def build_http_route(pool: Pool, gateway: GatewayRef, timeouts: Mapping[str, str] | None = None) -> JSON:
    """An HTTPRoute (gateway.networking.k8s.io/v1) from the named Gateway to the pool, as the
    inference extension's guides attach one (a backendRef of kind InferencePool), with `timeouts`
    (`route_timeouts`) on its rule and the spec's hostnames (Gateway API v1 HTTPRouteSpec.Hostnames:
    the Host header it answers for; none means every host the listener takes)."""
    parent: JSON = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    return {
        "apiVersion": f"{GATEWAY_GROUP}/v1",
        "kind": HTTP_ROUTE.kind,
        "metadata": _metadata(pool, pool.name),
        "spec": {
            "parentRefs": [parent],
            **({"hostnames": list(gateway.hostnames)} if gateway.hostnames else {}),
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [{"group": POOL_GROUP, "kind": INFERENCE_POOL.kind, "name": pool.name}],
                    **({"timeouts": dict(timeouts)} if timeouts else {}),
                }
            ],
        },
    }


def routing_status(pool_name: str, max_concurrency: int) -> JSON:
    return {"inferencePool": pool_name, "maxConcurrencyPerEndpoint": max_concurrency}


def _metadata(pool: Pool, name: str) -> JSON:
    return {"name": name, "namespace": pool.namespace, "labels": dict(pool.labels)}
