"""The resources the sandbox's API serves: Kubernetes' built-in kinds, and the optional APIs it can pretend to have.

Each entry is kmock's resource info of one `group/version/plural` (kind, short names, categories,
scope, verbs, subresources), what discovery lists; `RESOURCES` is served from the start, the
optional ones when a test or the sandbox asks (`KubeEmulator.serve_pod_monitors` and the like).
`initial_namespace` is a namespace every cluster starts with (`INITIAL_NAMESPACES`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from npu_operator.kube.objects import utc_now

from npu_sandbox.apiserver import custom_resources


def _api(
    kind: str,
    *,
    shortnames: Iterable[str] = (),
    categories: Iterable[str] = (),
    namespaced: bool = True,
    update: bool = False,
    subresources: Iterable[str] = (),
) -> dict[str, Any]:
    """kmock's resource info of a built-in kind (singular: the kind in lower case); `update`: PUT is
    served too (what helm and kubectl use on the kinds a chart installs)."""
    verbs = custom_resources.VERBS if update else custom_resources.VERBS - {"update"}
    return {
        "kind": kind,
        "singular": kind.lower(),
        "shortnames": set(shortnames),
        "categories": set(categories),
        "namespaced": namespaced,
        "verbs": set(verbs),
        "subresources": set(subresources),
    }


# Resources served by default: what the operator and its tests touch.
RESOURCES: dict[str, Any] = {
    "apps/v1/deployments": _api(
        "Deployment", shortnames={"deploy"}, categories={"all"}, subresources={"status", "scale"}
    ),
    "apps/v1/replicasets": _api("ReplicaSet", shortnames={"rs"}, subresources={"status", "scale"}),
    "apps/v1/statefulsets": _api(
        "StatefulSet", shortnames={"sts"}, categories={"all"}, subresources={"status", "scale"}
    ),
    "apps/v1/controllerrevisions": _api("ControllerRevision"),
    "v1/services": _api("Service", shortnames={"svc"}, categories={"all"}, subresources={"status"}),
    "v1/pods": _api("Pod", shortnames={"po"}, categories={"all"}, subresources={"status"}),
    "v1/persistentvolumeclaims": _api("PersistentVolumeClaim", shortnames={"pvc"}, subresources={"status"}),
    "v1/events": _api("Event", shortnames={"ev"}),
    # kopf looks the namespaces resource up even when it watches the whole cluster.
    "v1/namespaces": _api("Namespace", shortnames={"ns"}, namespaced=False),
    # What the nodes offer (the operator's node discovery; the kubelet's scheduling, node/scheduler.py).
    "v1/nodes": _api("Node", shortnames={"no"}, namespaced=False, subresources={"status"}),
    "policy/v1/poddisruptionbudgets": _api("PodDisruptionBudget", shortnames={"pdb"}, subresources={"status"}),
    # What a Helm chart installs, and Helm's own release storage (Secrets).
    "apiextensions.k8s.io/v1/customresourcedefinitions": _api(
        "CustomResourceDefinition", shortnames={"crd", "crds"}, namespaced=False, update=True, subresources={"status"}
    ),
    "v1/secrets": _api("Secret", update=True),
    "v1/configmaps": _api("ConfigMap", shortnames={"cm"}, update=True),
    "v1/serviceaccounts": _api("ServiceAccount", shortnames={"sa"}, update=True, subresources={"token"}),
    "rbac.authorization.k8s.io/v1/roles": _api("Role", update=True),
    "rbac.authorization.k8s.io/v1/rolebindings": _api("RoleBinding", update=True),
    "rbac.authorization.k8s.io/v1/clusterroles": _api("ClusterRole", namespaced=False, update=True),
    "rbac.authorization.k8s.io/v1/clusterrolebindings": _api("ClusterRoleBinding", namespaced=False, update=True),
}
# The namespaces every cluster starts with.
INITIAL_NAMESPACES: tuple[str, ...] = ("default", "kube-system", "kube-public", "kube-node-lease")
POD_MONITORS: tuple[str, Any] = ("monitoring.coreos.com/v1/podmonitors", _api("PodMonitor"))

# Optional APIs of spec.autoscaling and spec.routing (KEDA; the Gateway API Inference Extension).
SCALED_OBJECTS: tuple[str, Any] = (
    "keda.sh/v1alpha1/scaledobjects",
    _api("ScaledObject", shortnames={"so"}, subresources={"status"}),
)
INFERENCE_POOLS: tuple[str, Any] = (
    "inference.networking.k8s.io/v1/inferencepools",
    _api("InferencePool", shortnames={"infpool"}, subresources={"status"}),
)

LEADER_WORKER_SETS: tuple[str, Any] = (
    "leaderworkerset.x-k8s.io/v1/leaderworkersets",
    _api("LeaderWorkerSet", shortnames={"lws"}, subresources={"status", "scale"}),
)
# LeaderWorkerSet v0.10's DisaggregatedSet (config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml:
# no short names, a status subresource); the sandbox's stand-in for its controller is
# `npu_sandbox.controllers.disaggregated`.
DISAGGREGATED_SETS: tuple[str, Any] = (
    "disaggregatedset.x-k8s.io/v1/disaggregatedsets",
    _api("DisaggregatedSet", subresources={"status"}),
)
# Its per-role scale target (config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsetrolescalers.yaml:
# short name dsrs, status and scale subresources), installed with it.
ROLE_SCALERS: tuple[str, Any] = (
    "disaggregatedset.x-k8s.io/v1/disaggregatedsetrolescalers",
    _api("DisaggregatedSetRoleScaler", shortnames={"dsrs"}, subresources={"status", "scale"}),
)
# The scale subresource's paths of the kinds above whose CRD the sandbox serves without its object
# (the built-in kinds' are .spec.replicas, .status.replicas and .spec.selector): group, version, plural
# -> (specReplicasPath, statusReplicasPath, labelSelectorPath), as their CRDs declare them.
SCALE_PATHS: dict[tuple[str, str, str], tuple[str, str, str]] = {
    ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"): (
        ".spec.replicas",
        ".status.replicas",
        ".status.hpaPodSelector",
    ),
    ("disaggregatedset.x-k8s.io", "v1", "disaggregatedsetrolescalers"): (
        ".spec.replicas",
        ".status.replicas",
        ".status.selector",
    ),
}


def initial_namespace(name: str, resource_version: str) -> dict[str, Any]:
    """One of `INITIAL_NAMESPACES`, as the API server stores it when the cluster starts."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "resourceVersion": resource_version,
            "creationTimestamp": utc_now(),
            "labels": {"kubernetes.io/metadata.name": name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }
