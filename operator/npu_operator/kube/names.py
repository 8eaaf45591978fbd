"""The well-known names of the objects we create or read: ports, container names, labels and the
label keys and variables of the upstream controllers (LeaderWorkerSet, DisaggregatedSet). Pure.

One place for each name, read by the builders (`children`), by the status loop (`status`) and by
the watches (`controller`): LeaderWorkerSet keeps its own label keys in its API package the same way
(kubernetes-sigs/lws v0.10.0, api/leaderworkerset/v1/leaderworkerset_types.go).
"""

from __future__ import annotations

import re
from typing import Any, Final

from npu_runtime.contract import DEFAULT_METRICS_PORT, DEFAULT_PORT

from npu_operator.api import crd, spec
from npu_operator.kube.client import Resource

JSON = dict[str, Any]

HTTP_PORT: Final = DEFAULT_PORT
METRICS_PORT: Final = DEFAULT_METRICS_PORT
CONTAINER_NAME: Final = "runtime"
# Hub sources: the init container that downloads into the cache volume and links the revision.
FETCH_CONTAINER_NAME: Final = "fetch-model"
# The calibration record's file, mounted read-only from its ConfigMap in every engine pod.
RECORD_FILE: Final = "record.json"
RECORD_MOUNT: Final = spec.RECORD_MOUNT

NAME_LABEL: Final = f"{crd.GROUP}/name"
# A disaggregated resource's pods: prefill, decode or router.
ROLE_LABEL: Final = f"{crd.GROUP}/role"
ROUTER: Final = "router"

# LeaderWorkerSet (kubernetes-sigs/lws): the API, and what it tells each pod of a group.
LEADER_WORKER_SETS: Final = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
LWS_API_VERSION: Final = LEADER_WORKER_SETS.api_version
LWS_KIND: Final = LEADER_WORKER_SETS.kind
LWS_LEADER_ADDRESS: Final = "LWS_LEADER_ADDRESS"  # the leader pod's DNS name, set in every pod of a group
LWS_WORKER_INDEX: Final = "LWS_WORKER_INDEX"  # 0 for the leader, 1.. for the workers
LWS_WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"  # the group, 0..replicas-1
# A headless Service per group, `<lws>-<group>` (see workloads.build_leader_worker_set for why).
LWS_SUBDOMAIN_POLICY: Final = "UniquePerReplica"
# Target labels of every series of a multi-node replica's pods, from LeaderWorkerSet's pod labels:
# a panel can split replay latency and downgrades by group and node. A Deployment's pods have
# neither label, and Prometheus drops a target label whose value is empty.
RANK_TARGET_LABELS: Final = {"group": LWS_GROUP_INDEX_LABEL, "node_rank": LWS_WORKER_INDEX_LABEL}

# DisaggregatedSet (kubernetes-sigs/lws v0.10): the API, and the role label its controller puts on
# each role's LeaderWorkerSet (api/disaggregatedset/v1, RoleLabelKey).
DISAGGREGATED_SETS: Final = Resource("disaggregatedset.x-k8s.io", "v1", "disaggregatedsets", "DisaggregatedSet")
DS_API_VERSION: Final = DISAGGREGATED_SETS.api_version
DS_KIND: Final = DISAGGREGATED_SETS.kind
DS_ROLE_LABEL: Final = "disaggregatedset.x-k8s.io/role"
# The revision of the roles' templates, on each role's LeaderWorkerSet and on its pods' template
# (api/disaggregatedset/v1, RevisionLabelKey; pkg/utils/disaggregatedset/utils.go, GenerateLabels).
DS_REVISION_LABEL: Final = "disaggregatedset.x-k8s.io/revision"
# A role with `scaling.mode: External` takes its replicas from a DisaggregatedSetRoleScaler that the
# DisaggregatedSet controller creates, named `<set>-<role>`, with a scale subresource (spec.replicas,
# status.replicas, status.selector) that KEDA's HPA writes and reads (kubernetes-sigs/lws v0.10.0:
# api/disaggregatedset/v1/disaggregatedset_types.go RoleScaling, disaggregatedsetrolescaler_types.go;
# pkg/controllers/disaggregatedset/scaler_manager.go ScalerName, executor.go getTargetReplicas).
DS_ROLE_SCALERS: Final = Resource(
    "disaggregatedset.x-k8s.io", "v1", "disaggregatedsetrolescalers", "DisaggregatedSetRoleScaler"
)
DS_EXTERNAL_SCALING: Final = "External"


def role_scaler_name(set_name: str, role: str) -> str:
    """The DisaggregatedSetRoleScaler of a role whose scaling is External (scaler_manager.go ScalerName)."""
    return f"{set_name}-{role}"


def pod_label_meta(label: str) -> str:
    """Prometheus' discovery label of a pod label: `__meta_kubernetes_pod_label_<name>`, the name's
    other characters made underscores (Prometheus, discovery/kubernetes/pod.go, podLabels)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def rank_relabelings() -> list[JSON]:
    """The PodMonitor endpoints' relabelings that copy RANK_TARGET_LABELS from Prometheus' pod metadata."""
    return [
        {"action": "replace", "sourceLabels": [pod_label_meta(label)], "targetLabel": target}
        for target, label in RANK_TARGET_LABELS.items()
    ]


def api_server_pods_only() -> list[JSON]:
    """Relabelings that keep only the pods serving the engine's API on the http port: a Deployment's
    pods and a LeaderWorkerSet group's leader (worker index 0 or none), never a headless worker (its
    ranks serve no API) nor a P/D router (it serves its metrics on the metrics port only). Prometheus'
    regexes are RE2, anchored at both ends, without lookaround (Prometheus, model/relabel)."""
    return [
        {"action": "keep", "sourceLabels": [pod_label_meta(LWS_WORKER_INDEX_LABEL)], "regex": "0|"},
        {"action": "drop", "sourceLabels": [pod_label_meta(ROLE_LABEL)], "regex": ROUTER},
    ]


def selector_labels(name: str) -> dict[str, str]:
    """The labels that select one NPUInference's pods (immutable in a Deployment: never change)."""
    return {"app.kubernetes.io/name": "npu-inference", NAME_LABEL: name}


def serving_pod_labels(name: str, *, multi_node: bool) -> dict[str, str]:
    """The labels of the pods that serve the API, one per replica: every pod of a one-node replica, the
    leader (LeaderWorkerSet's worker index 0) of a multi-node one. The Service, the InferencePool
    and the scale subresource's selector (status.selector) all select these."""
    selector = selector_labels(name)
    if multi_node:
        selector[LWS_WORKER_INDEX_LABEL] = "0"
    return sorted_mapping(selector)


def selector_string(name: str, *, multi_node: bool = False) -> str:
    """The scale subresource's selector (status.selector): the pods that count as replicas."""
    return ",".join(f"{k}={v}" for k, v in sorted(serving_pod_labels(name, multi_node=multi_node).items()))


def labels(name: str) -> dict[str, str]:
    """The labels of every child of the resource `name` (the watches select on them)."""
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


def sorted_mapping(mapping: dict[str, Any]) -> dict[str, Any]:
    return {key: mapping[key] for key in sorted(mapping)}
