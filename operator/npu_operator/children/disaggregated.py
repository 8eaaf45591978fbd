"""Prefill/decode disaggregation: the children of a resource with `spec.disaggregation` (pure builders).

The resource's own workload fields describe the decode role; `spec.disaggregation.prefill` adds a
prefill role. Both roles are one `DisaggregatedSet` (kubernetes-sigs/lws v0.10.0,
api/disaggregatedset/v1/disaggregatedset_types.go: `spec.roles[]`, each a name plus a
LeaderWorkerSetTemplateSpec, at least two, rolled out together; its controller makes one
LeaderWorkerSet per role, pkg/controllers/disaggregatedset/lws_manager.go). Each role's template
is the LeaderWorkerSet `workloads` makes for a multi-node replica, built from that role's spec
(`api.roles.role_spec`), so a role can span nodes, plus:

- `--kv-transfer-config` for the role (`npu_runtime.kv_transfer`): kv_role producer (prefill) or
  consumer (decode), the connector's kv_port, an engine_id unique per pod (the pod's name; vLLM
  appends `_dp<rank>` per data-parallel rank) and both roles' mirrored dp/tp sizes;
- what the connector needs of the host network, as vllm-ascend's P/D tutorial sets it up: the
  NPUs' `/etc/hccn.conf` (hostPath, read-only; only with NPUs) and HCCL_IF_IP (the pod's IP),
  GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME, HCCL_SOCKET_IFNAME (the pod's interface);
- a role label, so that `<name>-prefill` and `<name>-decode` Services reach each role's engines.

The decode role's data-parallel ranks (`spec.disaggregation.decode.dataParallel`): `internal`, one
API server on each replica's leader over all its ranks, the other nodes headless (vLLM's internal
load balancing); `external`, as vllm-ascend v0.23.0's P/D tutorial runs decode
(docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md with
examples/external_online_dp/launch_online_dp.py and run_dp_template.sh): every pod runs one API
server per local rank (`npu-runtime serve --data-parallel-external`: vLLM's `--data-parallel-rank`,
rank i of the pod on port 8000 + i), the decode Service selects every decode pod and the router gets
one URL per rank port, so that each rank is an engine it chooses by load.

In front of them, the router (`npu-runtime route`) is the resource's Deployment, and the
resource's Service `<name>` selects it: the endpoint a client uses does not change when a resource
becomes disaggregated. The DisaggregatedSet's own headless Services are named after its
LeaderWorkerSets' revision hashes (service_manager.go, `buildService`: `<lws>-prv`), which cannot
be known here, hence the role Services of ours.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, Final

from npu_runtime.contract import EXTERNAL_DP_FLAG, KV_EVENTS_PORT, KV_REPLAY_PORT
from npu_runtime.routing.options import RouterOptions, route_argv

from npu_operator.api import host_mounts
from npu_operator.api.config import OperatorConfig
from npu_operator.api.roles import POD_NAME_ENV, ROLES, decode_rank_ports, external_decode, kv_transfer, role_spec
from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.children import engine_pod, kinds, workloads
from npu_operator.kube import names
from npu_operator.kube.names import DS_API_VERSION, DS_KIND, ROLE_LABEL, ROUTER

JSON = dict[str, Any]

ROUTER_CONTAINER: Final = "router"


def build_children(
    name: str,
    namespace: str,
    spec: NPUInferenceSpec,
    config: OperatorConfig,
    pod_monitor: bool,
    serving_revision: str | None = None,
) -> list[JSON]:
    """The router (Deployment), the roles (DisaggregatedSet), the Services; in apply order.

    `serving_revision`: the roles' revision the role Services select (both the same one, so that
    the router never pairs engines of two revisions; `topologies.disaggregated.serving_revision`).
    """
    children = [
        build_router(name, namespace, spec, config),
        build_disaggregated_set(name, namespace, spec, config),
        _service(name, namespace, ROUTER, name),
        *(_service(name, namespace, role, role_service_name(name, role), serving_revision, spec) for role in ROLES),
    ]
    if spec.pod_monitor.enabled and pod_monitor:
        monitor = workloads.build_pod_monitor(name, namespace, spec)
        # Each series also says which role's pod it is from (`inference_npu_dev_role`): the ScaledObjects
        # of the two roles read their own engines (`scaling.running_query`), a dashboard splits them.
        monitor["spec"]["podTargetLabels"].append(ROLE_LABEL)
        if external_decode(spec):
            _scrape_every_decode_rank(monitor, spec)
        children.append(monitor)
    return children


def rank_port_name(local: int) -> str:
    """The container port of a decode pod's rank `local` (external data parallel): `http` for the first."""
    return "http" if local == 0 else f"http-{local}"


def _rank_ports(spec: NPUInferenceSpec) -> list[JSON]:
    """The decode container's API ports past the first, one per further local rank (external)."""
    ports = decode_rank_ports(spec, names.HTTP_PORT)
    return [
        {"name": rank_port_name(local), "containerPort": port, "protocol": "TCP"}
        for local, port in enumerate(ports)
        if local > 0
    ]


def _scrape_every_decode_rank(monitor: JSON, spec: NPUInferenceSpec) -> None:
    """With external decode ranks every decode pod serves vLLM's /metrics on each rank's port (each
    rank's API server reports its own engine core): scrape them all, workers' pods included, so that
    the decode role's ScaledObject sums every rank's requests."""
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    api = next(endpoint for endpoint in endpoints if endpoint["port"] == "http")
    worker_index, role = (names.pod_label_meta(label) for label in (names.LWS_WORKER_INDEX_LABEL, ROLE_LABEL))
    # Keep a leader (worker index 0 or none) of either role, or any decode pod; the router is dropped after.
    keep = {"action": "keep", "sourceLabels": [worker_index, role], "separator": ";", "regex": "(0|);.*|[^;]*;decode"}
    relabelings = [keep if rule["action"] == "keep" else rule for rule in api["relabelings"]]
    api["relabelings"] = relabelings
    for port in _rank_ports(spec):
        only_decode = {"action": "keep", "sourceLabels": [role], "regex": "decode"}
        endpoints.append({**copy.deepcopy(api), "port": port["name"], "relabelings": [only_decode, *relabelings]})


def build_disaggregated_set(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    return {
        "apiVersion": DS_API_VERSION,
        "kind": DS_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": names.labels(name)},
        "spec": {"roles": [_role(name, namespace, spec, role, config) for role in ROLES]},
    }


def _role(name: str, namespace: str, spec: NPUInferenceSpec, role: str, config: OperatorConfig) -> JSON:
    rspec = role_spec(spec, role)
    lws_spec = workloads.build_leader_worker_set(name, namespace, rspec, config)["spec"]
    template = lws_spec["leaderWorkerTemplate"]["workerTemplate"]
    template["metadata"]["labels"] = names.sorted_mapping({**template["metadata"]["labels"], ROLE_LABEL: role})
    pod = template["spec"]
    if role != "decode":  # the record is the decode role's (its key names the role): prefill pods mount none
        engine_pod.without_calibration_record(pod)
    container = pod["containers"][0]
    # The args are already literals for the kubelet (`engine_pod.kubelet_literal`); so is this one,
    # but for the engine_id `$(POD_NAME)`, which the kubelet is meant to expand.
    transfer = kv_transfer(spec, role)
    literal = {**_literal_json(transfer.to_config()), "engine_id": transfer.engine_id}
    arg = json.dumps(literal, sort_keys=True, separators=(",", ":"))
    container["args"] = _with_serve_flags(container["args"], ["--kv-transfer-config", arg])
    if role == "decode" and external_decode(spec):  # one API server per local rank, on 8000 + its index
        container["args"] = _with_serve_flags(container["args"], [EXTERNAL_DP_FLAG])
        container["ports"] = [*container["ports"], *_rank_ports(spec)]
    env = {var["name"]: var for var in container["env"]}
    defaults: dict[str, JSON] = {
        POD_NAME_ENV: {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        # The variables vllm-ascend's P/D tutorial exports on every prefill and decode node.
        **engine_pod.host_network_env(),
    }
    env = {**defaults, **env}
    container["env"] = [env[key] for key in sorted(env)]
    if rspec.npu.count > 0:  # the NPUs' network configuration, which Mooncake's Ascend transport reads, and hccn_tool
        engine_pod.add_host_mounts(pod, (host_mounts.HCCN_CONF, host_mounts.DRIVER_TOOLS))
    # The controller puts the role template's metadata on the role's LeaderWorkerSet (lws_manager.go,
    # Create: mergeLabels(config.ObjectMeta.Labels, ...)), and LeaderWorkerSet copies its labels onto
    # its StatefulSets: with ours they are watched, and the status loop follows the chain.
    built: JSON = {
        "name": role,
        "metadata": {"labels": names.sorted_mapping({**names.labels(name), ROLE_LABEL: role})},
        "spec": lws_spec,
    }
    if role == "prefill" and spec.autoscaling is not None:
        # The prefill role scales on its own: LeaderWorkerSet's controller creates the role's
        # DisaggregatedSetRoleScaler `<name>-prefill` (seeded with the role's current replicas, or 1)
        # and takes the role's replicas from it, ignoring these (executor.go getTargetReplicas);
        # KEDA writes it (`scaling.build_prefill_scaled_object`). The decode role stays Static: its
        # replicas are spec.replicas, the NPUInference's own scale subresource.
        built["scaling"] = {"mode": names.DS_EXTERNAL_SCALING}
    return built


def _literal_json(value: Any) -> Any:
    """`value` (a user's JSON) with every string in it a literal for the kubelet."""
    if isinstance(value, str):
        return engine_pod.kubelet_literal(value)
    if isinstance(value, Mapping):
        return {engine_pod.kubelet_literal(str(key)): _literal_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_literal_json(item) for item in value]
    return value


def role_service_name(name: str, role: str) -> str:
    """The Service of a role's leaders, which the router calls (`<name>-prefill`, `<name>-decode`)."""
    return (kinds.PREFILL_SERVICE if role == "prefill" else kinds.DECODE_SERVICE).child_name(name)


def _with_serve_flags(args: list[str], flags: list[str]) -> list[str]:
    """`npu-runtime serve` args with `flags` added before the engine's extra arguments (`--`)."""
    cut = args.index("--") if "--" in args else len(args)
    return [*args[:cut], *flags, *args[cut:]]


def router_options(name: str, namespace: str, spec: NPUInferenceSpec) -> RouterOptions:
    assert spec.disaggregation is not None
    router = spec.disaggregation.router
    host = {role: f"http://{role_service_name(name, role)}.{namespace}.svc" for role in ROLES}
    return RouterOptions(
        prefill=(f"{host['prefill']}:{names.HTTP_PORT}",),
        # External decode ranks: one URL per rank port; each resolves to every decode pod, so each
        # address and port (a rank's API server) is an engine of its own.
        decode=tuple(f"{host['decode']}:{port}" for port in decode_rank_ports(spec, names.HTTP_PORT)),
        port=names.HTTP_PORT,
        metrics_port=names.METRICS_PORT,
        first_byte_timeout=float(router.timeout_seconds),
        retries=router.retries,
        **_cache_aware_options(spec),
    )


def _cache_aware_options(spec: NPUInferenceSpec) -> dict[str, Any]:
    """The router's cache-aware choice of the prefill engine (spec.cacheAwareRouting): with kvEvents it
    subscribes to each prefill pod's events, one PUB socket per DP rank of the pod on the events' port
    plus the rank (npu_runtime.contract.KV_EVENTS_PORT), replay likewise. The ranks of one prefill pod
    are its replica's data ranks over its nodes; the API server, on the leader, answers for them all."""
    assert spec.disaggregation is not None
    if spec.cache_aware_routing is None:
        return {}
    options: dict[str, Any] = {
        "cache_aware": True,
        "kv_events_port": 0,
        "kv_replay_port": 0,
    }  # no events: by prompts sent
    if spec.kv_events:
        prefill = spec.disaggregation.prefill
        options.update(
            kv_events_port=KV_EVENTS_PORT,
            kv_replay_port=KV_REPLAY_PORT,
            kv_events_ranks=prefill.parallelism.data // prefill.nodes,
        )
    return options


def build_router(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    """The router's Deployment: `npu-runtime route` from the runtime image, behind the resource's Service."""
    assert spec.disaggregation is not None
    selector = {**names.selector_labels(name), ROLE_LABEL: ROUTER}
    options = router_options(name, namespace, spec)
    container: JSON = {
        "name": ROUTER_CONTAINER,
        "image": spec.engine.image or config.runtime_image,
        "args": [engine_pod.kubelet_literal(arg) for arg in ["npu-runtime", "route", *route_argv(options)]],
        "ports": [
            {"name": "http", "containerPort": names.HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": names.METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        # Ready when both roles have an engine that answers /health.
        "readinessProbe": engine_pod.probe("/readyz", period=engine_pod.PROBE_PERIOD_SECONDS, failures=3),
        "livenessProbe": engine_pod.probe("/healthz", period=engine_pod.PROBE_PERIOD_SECONDS, failures=4),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(engine_pod.RUNTIME_SECURITY_CONTEXT),
    }
    if spec.engine.image_pull_policy:
        container["imagePullPolicy"] = spec.engine.image_pull_policy
    pod_spec: JSON = {
        "containers": [container],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    if spec.template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in spec.template.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": names.labels(name)},
        "spec": {
            "replicas": spec.disaggregation.router.replicas,
            "selector": {"matchLabels": names.sorted_mapping(selector)},
            "template": {
                "metadata": {"labels": names.sorted_mapping({**names.labels(name), ROLE_LABEL: ROUTER})},
                "spec": pod_spec,
            },
        },
    }


def _service(
    name: str,
    namespace: str,
    role: str,
    service_name: str,
    revision: str | None = None,
    spec: NPUInferenceSpec | None = None,
) -> JSON:
    """The router's Service (the resource's endpoint) or a role's: its engines' leaders (worker index 0),
    of `revision` only where one is given (`names.DS_REVISION_LABEL`, on every role pod). A role's
    Service is headless: its name resolves to each ready leader's address, which the router looks
    up and chooses among by load (`npu_runtime.routing.engines`); a virtual IP would hide them.
    With external decode ranks the decode Service selects every decode pod (each pod's ranks serve
    their own API) and names each rank's port."""
    external = role == "decode" and spec is not None and external_decode(spec)
    service = workloads.build_service(name, namespace, leaders_only=role != ROUTER and not external)
    service["metadata"]["name"] = service_name
    if role != ROUTER:
        service["spec"]["clusterIP"] = "None"
    if external and spec is not None:
        service["spec"]["ports"] += [
            {"name": port["name"], "port": port["containerPort"], "targetPort": port["name"], "protocol": "TCP"}
            for port in _rank_ports(spec)
        ]
    selector = {**service["spec"]["selector"], ROLE_LABEL: role}
    if revision is not None and role != ROUTER:
        selector[names.DS_REVISION_LABEL] = revision
    service["spec"]["selector"] = names.sorted_mapping(selector)
    return service
