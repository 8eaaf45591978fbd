"""Prefill/decode disaggregation: the children of a resource with `spec.disaggregation` (pure builders).

The resource's own workload fields describe the decode role; `spec.disaggregation.prefill` adds a
prefill role. Both roles are one `DisaggregatedSet` (kubernetes-sigs/lws v0.10.0,
api/disaggregatedset/v1/disaggregatedset_types.go: `spec.roles[]`, each a name plus a
LeaderWorkerSetTemplateSpec, at least two, rolled out together; its controller makes one
LeaderWorkerSet per role, pkg/controllers/disaggregatedset/lws_manager.go). Each role's template
is the LeaderWorkerSet `builders` makes for a multi-node replica, built from that role's spec
(`role_spec`), so a role can span nodes, plus:

- `--kv-transfer-config` for the role (`npu_runtime.kv_transfer`): kv_role producer (prefill) or
  consumer (decode), the connector's kv_port, an engine_id unique per pod (the pod's name; vLLM
  appends `_dp<rank>` per data-parallel rank) and both roles' mirrored dp/tp sizes;
- what the connector needs of the host network, as vllm-ascend's P/D tutorial sets it up: the
  NPUs' `/etc/hccn.conf` (hostPath, read-only; only with NPUs) and HCCL_IF_IP (the pod's IP),
  GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME, HCCL_SOCKET_IFNAME (the pod's interface);
- a role label, so that `<name>-prefill` and `<name>-decode` Services reach each role's leaders.

In front of them, the router (`npu-runtime route`) is the resource's Deployment, and the
resource's Service `<name>` selects it: the endpoint a client uses does not change when a resource
becomes disaggregated. The DisaggregatedSet's own headless Services are named after its
LeaderWorkerSets' revision hashes (service_manager.go, `buildService`: `<lws>-prv`), which cannot
be known here, hence the role Services of ours.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from npu_runtime.kv_transfer import KVTransfer, RoleSizes, problems, reserved_port_floor
from npu_runtime.routing.router import RouterOptions, route_argv

from npu_operator import aggregate, builders, children, crd, ownership
from npu_operator.api import NPUInferenceSpec
from npu_operator.config import OperatorConfig

JSON = dict[str, Any]

DS_API_VERSION: Final = children.DISAGGREGATED_SET.resource.api_version  # disaggregatedset.x-k8s.io/v1
DS_KIND: Final = children.DISAGGREGATED_SET.kind
ROLES: Final = ("prefill", "decode")
ROUTER: Final = "router"
ROLE_LABEL: Final = f"{crd.GROUP}/role"
# The DisaggregatedSet controller's role label on each role's LeaderWorkerSet (api/disaggregatedset/v1,
# RoleLabelKey).
DS_ROLE_LABEL: Final = "disaggregatedset.x-k8s.io/role"
ROUTER_CONTAINER: Final = "router"
HCCN_CONF: Final = "/etc/hccn.conf"
HCCN_VOLUME: Final = "hccn-conf"
POD_NAME_ENV: Final = "POD_NAME"


def role_spec(spec: NPUInferenceSpec, role: str) -> NPUInferenceSpec:
    """The spec one role's engines are built and planned from.

    decode: the resource's own workload fields. prefill: its own replicas, NPUs, parallelism,
    graph mode and engine settings; the model, image, dtype, quantization and maxModelLen are the
    decode role's, so the two cannot disagree. With speculative decoding the prefill role proposes
    one token (vllm-ascend's P/D tutorial: "num_speculative_tokens on P nodes should be 1").
    """
    decode = dataclasses.replace(spec, disaggregation=None)
    if role == "decode":
        return decode
    assert spec.disaggregation is not None and role == "prefill", role
    prefill = spec.disaggregation.prefill
    speculative = spec.engine.speculative
    return dataclasses.replace(
        decode,
        # The DisaggregatedSet rolls out all roles or none: scaled to zero, both roles are.
        replicas=prefill.replicas if spec.replicas > 0 else 0,
        npu=dataclasses.replace(spec.npu, count=prefill.npu_count, nodes=prefill.nodes),
        parallelism=prefill.parallelism,
        graph=dataclasses.replace(spec.graph, mode=prefill.graph_mode, capture_sizes=None, max_capture_size=None),
        engine=dataclasses.replace(
            spec.engine,
            max_num_seqs=prefill.max_num_seqs,
            max_num_batched_tokens=prefill.max_num_batched_tokens,
            gpu_memory_utilization=prefill.gpu_memory_utilization,
            additional_config=prefill.additional_config,
            extra_args=prefill.extra_args,
            env=(*spec.engine.env, *prefill.env),
            speculative=dataclasses.replace(speculative, num_tokens=1) if speculative else None,
        ),
    )


def _sizes(spec: NPUInferenceSpec) -> RoleSizes:
    return RoleSizes(spec.parallelism.data, spec.parallelism.tensor, spec.parallelism.pipeline)


def kv_transfer(spec: NPUInferenceSpec, role: str) -> KVTransfer:
    """One role's connector settings (the same port, connector and sizes on both roles)."""
    assert spec.disaggregation is not None
    connector = spec.disaggregation.connector
    prefill, decode = role_spec(spec, "prefill"), role_spec(spec, "decode")
    port = connector.port or reserved_port_floor(max(prefill.npu.count, decode.npu.count))
    return KVTransfer(
        connector=connector.name,
        role=role,
        port=port,
        prefill=_sizes(prefill),
        decode=_sizes(decode),
        engine_id=f"$({POD_NAME_ENV})",
        extra=connector.extra_config,
    )


def connector_problems(spec: NPUInferenceSpec) -> list[tuple[str, str]]:
    """(setting under spec.disaggregation.connector, why) for each rule of the connector a role breaks."""
    found: list[tuple[str, str]] = []
    for role in ROLES:
        for problem in problems(kv_transfer(spec, role), role_spec(spec, role).npu.count):
            if problem not in found:
                found.append(problem)
    return found


def build_children(
    name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig, pod_monitor: bool
) -> list[JSON]:
    """The router (Deployment), the roles (DisaggregatedSet), the Services; in apply order."""
    children = [
        build_router(name, namespace, spec, config),
        build_disaggregated_set(name, namespace, spec, config),
        _service(name, namespace, ROUTER, name),
        *(_service(name, namespace, role, role_service_name(name, role)) for role in ROLES),
    ]
    if spec.pod_monitor.enabled and pod_monitor:
        children.append(builders.build_pod_monitor(name, namespace, spec))
    return children


def build_disaggregated_set(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    return {
        "apiVersion": DS_API_VERSION,
        "kind": DS_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": builders.labels(name)},
        "spec": {"roles": [_role(name, namespace, spec, role, config) for role in ROLES]},
    }


def _role(name: str, namespace: str, spec: NPUInferenceSpec, role: str, config: OperatorConfig) -> JSON:
    rspec = role_spec(spec, role)
    lws_spec = builders.build_leader_worker_set(name, namespace, rspec, config)["spec"]
    template = lws_spec["leaderWorkerTemplate"]["workerTemplate"]
    template["metadata"]["labels"] = builders.sorted_mapping({**template["metadata"]["labels"], ROLE_LABEL: role})
    pod = template["spec"]
    container = pod["containers"][0]
    # The args are already literals for the kubelet (`builders.kubelet_literal`); so is this one,
    # but for the engine_id `$(POD_NAME)`, which the kubelet is meant to expand.
    transfer = kv_transfer(spec, role)
    literal = {**_literal_json(transfer.to_config()), "engine_id": transfer.engine_id}
    arg = json.dumps(literal, sort_keys=True, separators=(",", ":"))
    container["args"] = _with_serve_flags(container["args"], ["--kv-transfer-config", arg])
    env = {var["name"]: var for var in container["env"]}
    defaults: dict[str, JSON] = {
        POD_NAME_ENV: {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        # The variables vllm-ascend's P/D tutorial exports on every prefill and decode node.
        **builders.host_network_env(),
    }
    env = {**defaults, **env}
    container["env"] = [env[key] for key in sorted(env)]
    if rspec.npu.count > 0:  # the NPUs' network configuration, which Mooncake's Ascend transport reads
        pod["volumes"].append({"name": HCCN_VOLUME, "hostPath": {"path": HCCN_CONF, "type": "File"}})
        container["volumeMounts"].append({"name": HCCN_VOLUME, "mountPath": HCCN_CONF, "readOnly": True})
    # The controller puts the role template's metadata on the role's LeaderWorkerSet (lws_manager.go,
    # Create: mergeLabels(config.ObjectMeta.Labels, ...)), and LeaderWorkerSet copies its labels onto
    # its StatefulSets: with ours they are watched, and the status loop follows the chain.
    return {
        "name": role,
        "metadata": {"labels": builders.sorted_mapping({**builders.labels(name), ROLE_LABEL: role})},
        "spec": lws_spec,
    }


def _literal_json(value: Any) -> Any:
    """`value` (a user's JSON) with every string in it a literal for the kubelet."""
    if isinstance(value, str):
        return builders.kubelet_literal(value)
    if isinstance(value, Mapping):
        return {builders.kubelet_literal(str(key)): _literal_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_literal_json(item) for item in value]
    return value


def role_service_name(name: str, role: str) -> str:
    """The Service of a role's leaders, which the router calls (`<name>-prefill`, `<name>-decode`)."""
    return (children.PREFILL_SERVICE if role == "prefill" else children.DECODE_SERVICE).child_name(name)


def _with_serve_flags(args: list[str], flags: list[str]) -> list[str]:
    """`npu-runtime serve` args with `flags` added before the engine's extra arguments (`--`)."""
    cut = args.index("--") if "--" in args else len(args)
    return [*args[:cut], *flags, *args[cut:]]


def router_options(name: str, namespace: str, spec: NPUInferenceSpec) -> RouterOptions:
    assert spec.disaggregation is not None
    router = spec.disaggregation.router
    url = {role: f"http://{role_service_name(name, role)}.{namespace}.svc:{builders.HTTP_PORT}" for role in ROLES}
    return RouterOptions(
        prefill=(url["prefill"],),
        decode=(url["decode"],),
        port=builders.HTTP_PORT,
        metrics_port=builders.METRICS_PORT,
        timeout=float(router.timeout_seconds),
        retries=router.retries,
    )


def build_router(name: str, namespace: str, spec: NPUInferenceSpec, config: OperatorConfig) -> JSON:
    """The router's Deployment: `npu-runtime route` from the runtime image, behind the resource's Service."""
    assert spec.disaggregation is not None
    selector = {**builders.selector_labels(name), ROLE_LABEL: ROUTER}
    options = router_options(name, namespace, spec)
    container: JSON = {
        "name": ROUTER_CONTAINER,
        "image": spec.engine.image or config.runtime_image,
        "args": [builders.kubelet_literal(arg) for arg in ["npu-runtime", "route", *route_argv(options)]],
        "ports": [
            {"name": "http", "containerPort": builders.HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": builders.METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        # Ready when both roles have an engine that answers /health.
        "readinessProbe": builders.probe("/readyz", period=builders.PROBE_PERIOD_SECONDS, failures=3),
        "livenessProbe": builders.probe("/healthz", period=builders.PROBE_PERIOD_SECONDS, failures=4),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": copy.deepcopy(builders.RUNTIME_SECURITY_CONTEXT),
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
        "metadata": {"name": name, "namespace": namespace, "labels": builders.labels(name)},
        "spec": {
            "replicas": spec.disaggregation.router.replicas,
            "selector": {"matchLabels": builders.sorted_mapping(selector)},
            "template": {
                "metadata": {"labels": builders.sorted_mapping({**builders.labels(name), ROLE_LABEL: ROUTER})},
                "spec": pod_spec,
            },
        },
    }


def _service(name: str, namespace: str, role: str, service_name: str) -> JSON:
    """The router's Service (the resource's endpoint) or a role's: its engines' leaders (worker index 0)."""
    service = builders.build_service(name, namespace, leaders_only=role != ROUTER)
    service["metadata"]["name"] = service_name
    service["spec"]["selector"] = builders.sorted_mapping({**service["spec"]["selector"], ROLE_LABEL: role})
    return service


def role_workloads(leader_worker_sets: Iterable[Mapping[str, Any]], ds_uid: str) -> dict[str, list[Mapping[str, Any]]]:
    """The LeaderWorkerSets the DisaggregatedSet `ds_uid` controls, by role (several while a rollout
    runs two revisions). The controller names each `<set>-<slice>-<revision>-<role>` and labels it
    with its role (pkg/utils/disaggregatedset/utils.go, GenerateName, GenerateLabels: RoleLabelKey),
    owned by the DisaggregatedSet with `controller: true` (lws_manager.go, Create); only the owner
    reference makes one ours, a label can be copied."""
    found: dict[str, list[Mapping[str, Any]]] = {role: [] for role in ROLES}
    for lws in leader_worker_sets:
        if ownership.controller_uid(lws) != ds_uid:
            continue
        role = ((lws.get("metadata") or {}).get("labels") or {}).get(DS_ROLE_LABEL)
        if role in found:
            found[role].append(lws)
    return found


def workload_view(
    ds: Mapping[str, Any], roles: Mapping[str, Sequence[Mapping[str, Any]]], router: Mapping[str, Any] | None
) -> JSON:
    """A DisaggregatedSet seen as the resource's workload, from its roles' LeaderWorkerSets.

    LeaderWorkerSet v0.10.0's DisaggregatedSet controller writes no status of its own (its
    `RoleStatus` type is declared, nothing sets it), so the counts are the role LeaderWorkerSets'
    (replicas, readyReplicas, updatedReplicas), summed over revisions. The resource's replicas are the
    decode role's; none is ready while the prefill role or the router (the Deployment `router`, the
    resource's endpoint) has no ready replica: no request could be served. The newest LeaderWorkerSet
    of a role is its current revision (the controller makes the new revision's before it scales the
    old one down, executor.go).
    """
    counts = {role: _role_counts(roles.get(role, ())) for role in ROLES}
    decode, prefill = counts["decode"], counts["prefill"]
    created = all(roles.get(role) for role in ROLES)
    status = {
        "replicas": decode["replicas"],
        "updatedReplicas": decode["updatedReplicas"],
        "readyReplicas": decode["readyReplicas"] if prefill["readyReplicas"] > 0 and _ready(router) > 0 else 0,
        "observedGeneration": int((ds.get("metadata") or {}).get("generation", 0)) if created else 0,
    }
    return {"metadata": dict(ds.get("metadata") or {}), "status": status}


def _ready(workload: Mapping[str, Any] | None) -> int:
    value = ((workload or {}).get("status") or {}).get("readyReplicas", 0)
    return value if isinstance(value, int) else 0


def _role_counts(leader_worker_sets: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    def count(lws: Mapping[str, Any], key: str) -> int:
        value = (lws.get("status") or {}).get(key, 0)
        return value if isinstance(value, int) else 0

    newest = max(leader_worker_sets, key=_created, default=None)
    return {
        "replicas": sum(count(lws, "replicas") for lws in leader_worker_sets),
        "readyReplicas": sum(count(lws, "readyReplicas") for lws in leader_worker_sets),
        "updatedReplicas": count(newest, "updatedReplicas") if newest is not None else 0,
    }


def _created(lws: Mapping[str, Any]) -> tuple[str, str]:
    meta = lws.get("metadata") or {}
    return str(meta.get("creationTimestamp", "")), str(meta.get("name", ""))


def role_pods(
    pods: Sequence[Mapping[str, Any]],
    links: Sequence[Mapping[str, Any]],
    roles: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, list[Mapping[str, Any]]]:
    """Each role's pods: those whose owner chain (`ownership`, a LeaderWorkerSet's, through `links`)
    leads to one of the role's LeaderWorkerSets."""
    chains = ownership.owner_chains(pods, [*links, *pods])  # one walk per pod for every role's LWS
    found: dict[str, list[Mapping[str, Any]]] = {}
    for role in ROLES:
        found[role] = [
            pod
            for lws in roles.get(role, ())
            if (uid := (lws.get("metadata") or {}).get("uid"))
            for pod, chain in zip(pods, chains, strict=True)
            if str(uid) in chain
        ]
    return found


def graph_status(
    spec: NPUInferenceSpec,
    reports: Mapping[str, Sequence[aggregate.PodReport]],
    previous: Mapping[str, Any],
    *,
    now: str,
    same_generation: bool,
) -> JSON:
    """`status.graph` of a disaggregated resource: `roles.<role>` is what `aggregate.graph_status`
    makes of that role's pods (its ranks, modes, capture sizes and memory, downgrades; each bounded
    as for one workload, so the whole is at most twice that); the top level is the decode role's
    mode, the one the resource's graph settings ask for."""
    before = dict(role_graphs(previous))
    roles: JSON = {}
    for role in ROLES:
        rspec = role_spec(spec, role)
        old = before.get(role, {})
        roles[role] = aggregate.graph_status(
            rspec.graph.mode,
            reports.get(role, ()),
            old,
            now=now,
            same_generation=same_generation,
            nodes=rspec.npu.nodes,
        )
    graph: JSON = {"requestedMode": spec.graph.mode}
    if "effectiveMode" in roles["decode"]:
        graph["effectiveMode"] = roles["decode"]["effectiveMode"]
    graph["roles"] = roles
    return graph


def role_graphs(graph: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(role, its graph) of a disaggregated resource's `status.graph`; empty for any other."""
    roles = graph.get("roles")
    if not isinstance(roles, Mapping):
        return []
    return [(role, roles[role]) for role in ROLES if isinstance(roles.get(role), Mapping)]
